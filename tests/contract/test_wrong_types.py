"""Values of the wrong type deep in a body, or digits of another script, get a 400."""

from __future__ import annotations

import pytest
import requests

ANTHROPIC = {"anthropic-version": "2023-06-01"}


def document_body(content) -> dict:
    source = {"type": "content", "content": content}
    block = {"type": "document", "source": source}
    return {
        "model": "dev-chat",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": [block]}],
    }


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("content", [5, True, 1.5, {"text": "a"}, [5], ["a"], [{"text": 5}]])
def test_a_documents_content_of_the_wrong_type_is_a_400_in_anthropics_envelope(
    live_server, funded_key, path, content
):
    response = requests.post(
        f"{live_server.url}{path}",
        headers={"x-api-key": funded_key.key, **ANTHROPIC},
        json=document_body(content),
        timeout=30,
    )

    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith("messages[0].content[0].source.content")


@pytest.mark.parametrize("limit", ["%C2%B2", "%D9%A1", "%EF%BC%95", "1%C2%B9"])
def test_a_page_size_in_digits_other_than_ascii_is_a_400(live_server, funded_key, limit):
    headers = {"Authorization": f"Bearer {funded_key.key}"}
    created = requests.post(
        f"{live_server.url}/v1/responses",
        headers=headers,
        json={"model": "dev-chat", "input": "Hello", "max_output_tokens": 5},
        timeout=30,
    )
    assert created.status_code == 200, created.text

    items = requests.get(
        f"{live_server.url}/v1/responses/{created.json()['id']}/input_items?limit={limit}",
        headers=headers,
        timeout=30,
    )
    # The model list pages only for Anthropic's clients.
    models = requests.get(
        f"{live_server.url}/v1/models?limit={limit}", headers={**headers, **ANTHROPIC}, timeout=30
    )

    assert items.status_code == 400, items.text
    assert items.json()["error"]["param"] == "limit"
    assert models.status_code == 400, models.text
    assert models.json()["error"]["type"] == "invalid_request_error"
