"""The OpenAPI document, served by the running service and held to by it.

Schemathesis generates requests for every operation of the document (the one the service
serves at /v1/openapi.json) (valid and invalid bodies, odd path values) and sends them, with a
funded key, to a real gunicorn: no answer may be a 5xx, every answer must match the
document (status, content type, body schema, headers), and every error is the envelope.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from tests.conftest import running_server
from tests.statement_checks import new_signing_pem

DOCUMENT = Path(__file__).resolve().parents[2] / "app" / "openapi.json"
ERROR_STATUSES = {"400", "401", "402", "403", "404", "413", "415", "429", "500", "502", "503"}


@pytest.fixture(scope="session")
def openapi_server(app, database_url, tmp_path_factory):
    """A server without rate limits, so generated requests all reach the views.

    It signs statements with a key of its own, not one kept in the instance folder.
    """
    folder = tmp_path_factory.mktemp("openapi")
    signing = new_signing_pem()
    with running_server(
        database_url, folder, RATE_LIMIT="off", LEDGER_SIGNING_KEY=signing
    ) as server:
        yield server


# The tracked document, which the service serves byte for byte (tested below); loaded
# from the file because schemathesis's lazy, fixture-made schemas fail under pytest 9.
schema = schemathesis.openapi.from_path(DOCUMENT)
# A body can match the schema and still be refused with 400: the model must be in the
# live catalog, and fields depend on each other (tool_choice needs tools, a tool message
# its tool_call_id), which no schema of the body can say.
EXCLUDED_CHECKS = [schemathesis.checks.positive_data_acceptance]


@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_every_operation_answers_as_documented(case, openapi_server, funded_key):
    response = case.call_and_validate(
        base_url=openapi_server.url,
        headers={"Authorization": f"Bearer {funded_key.key}"},
        excluded_checks=EXCLUDED_CHECKS,
        timeout=30,
    )

    assert response.status_code < 500 or response.status_code == 529, response.text
    if response.status_code >= 400:
        body = response.json()
        if speaks_gemini(case):
            assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "status"}
            assert body["error"]["code"] == response.status_code
        elif speaks_anthropic(case):
            assert set(body) == {"type", "error"} and body["type"] == "error"
            assert set(body["error"]) == {"type", "message"}
        else:
            assert set(body) == {"error"}
            assert set(body["error"]) == {"message", "type", "code", "param"}


def speaks_gemini(case) -> bool:
    """Tell whether errors of ``case`` come in Google's envelope: the Gemini door's own."""
    return case.path.startswith("/v1beta/")


def speaks_anthropic(case) -> bool:
    """Tell whether errors of ``case`` come in Anthropic's envelope: the Messages door's own."""
    headers = {name.lower() for name in case.headers or {}}
    return case.path.startswith("/v1/messages") or "anthropic-version" in headers


def test_the_document_is_served_without_a_key_as_tracked(live_server):
    response = requests.get(f"{live_server.url}/v1/openapi.json", timeout=30)

    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json() == json.loads(DOCUMENT.read_text())


def test_the_document_covers_the_public_api():
    document = json.loads(DOCUMENT.read_text())

    assert document["openapi"].startswith("3.1") and document["info"]["version"] == "1.0.0"
    assert {
        "/v1/chat/completions",
        "/v1/models",
        "/v1/models/{model}",
        "/v1/credits",
        "/v1/openapi.json",
        "/v1/responses",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/input_items",
        "/v1/embeddings",
        "/healthz",
        "/readyz",
    } <= set(document["paths"])
    messages = document["paths"]["/v1/messages"]["post"]
    assert messages["operationId"] == "createMessage"
    assert {"application/json", "text/event-stream"} == set(messages["responses"]["200"]["content"])
    assert (ERROR_STATUSES | {"529"}) - {"409"} <= set(messages["responses"])
    assert "/v1/messages/count_tokens" in document["paths"]
    gemini = document["paths"]["/v1beta/models/{model}:generateContent"]["post"]
    assert gemini["operationId"] == "generateContent"
    assert ERROR_STATUSES <= set(gemini["responses"])
    assert {
        "/v1beta/models/{model}:streamGenerateContent",
        "/v1beta/models/{model}:countTokens",
        "/v1beta/models/{model}:embedContent",
        "/v1beta/models/{model}:batchEmbedContents",
        "/v1beta/models",
        "/v1beta/models/{model}",
    } <= set(document["paths"])
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert chat["operationId"] == "createChatCompletion"
    assert {"application/json", "text/event-stream"} == set(chat["responses"]["200"]["content"])
    assert ERROR_STATUSES - {"404"} <= set(chat["responses"])
    documented = {
        status
        for operations in document["paths"].values()
        for operation in operations.values()
        for status in operation["responses"]
    }
    assert ERROR_STATUSES <= documented
    envelopes = {
        "Anthropic": {"$ref": "#/components/schemas/AnthropicError"},
        "Gemini": {"$ref": "#/components/schemas/GeminiError"},
        "": {"$ref": "#/components/schemas/Error"},
    }
    for name, response in document["components"]["responses"].items():
        door = next((door for door in ("Anthropic", "Gemini") if name.startswith(door)), "")
        envelope = envelopes[door]
        assert response["content"]["application/json"]["schema"] == envelope, name
    schemas = document["components"]["schemas"]
    for usage in ("Usage", "MessageUsage"):
        assert schemas[usage]["properties"]["cost"] == {"$ref": "#/components/schemas/Cost"}
    assert "total_cost" in schemas["Cost"]["required"]
    error = schemas["Error"]["properties"]["error"]
    assert error["required"] == ["message", "type", "code", "param"]
    response = schemas["ChatCompletionResponse"]
    assert response["properties"]["system_fingerprint"] == {"type": "string"}
    assert "system_fingerprint" in response["required"]
    responses = document["paths"]["/v1/responses"]["post"]
    assert responses["operationId"] == "createResponse"
    assert {"application/json", "text/event-stream"} == set(
        responses["responses"]["200"]["content"]
    )
    assert ERROR_STATUSES <= set(responses["responses"])
    assert schemas["ResponseUsage"]["properties"]["cost"] == {"$ref": "#/components/schemas/Cost"}
    embeddings = document["paths"]["/v1/embeddings"]["post"]
    assert embeddings["operationId"] == "createEmbeddings"
    assert ERROR_STATUSES - {"404"} <= set(embeddings["responses"])
    assert schemas["EmbeddingUsage"]["properties"]["cost"] == {"$ref": "#/components/schemas/Cost"}
    for method in ("embedContent", "batchEmbedContents"):
        operation = document["paths"][f"/v1beta/models/{{model}}:{method}"]["post"]
        assert operation["operationId"] == method
        assert ERROR_STATUSES <= set(operation["responses"])
    usage = schemas["GeminiEmbeddingUsageMetadata"]
    assert usage["required"] == ["promptTokenCount", "cost"]


def test_the_messages_and_responses_bodies_are_documented_in_their_shapes():
    schemas = json.loads(DOCUMENT.read_text())["components"]["schemas"]

    def branches(name: str) -> set[str]:
        return {branch["$ref"].rsplit("/", 1)[1] for branch in schemas[name]["anyOf"]}

    assert {
        "TextBlockParam", "ImageBlockParam", "DocumentBlockParam", "ToolUseBlockParam",
        "ToolResultBlockParam", "ThinkingBlockParam", "RedactedThinkingBlockParam",
        "OtherBlockParam",
    } == branches("ContentBlockParam")  # fmt: skip
    sources = [
        branch["properties"]["type"]["const"] for branch in schemas["DocumentSource"]["anyOf"]
    ]
    assert sources == ["text", "content", "base64", "url"]
    assert {
        "ResponseMessageItem", "ResponseFunctionCallItem", "ResponseFunctionCallOutputItem",
        "ResponseReasoningItem", "ResponseItemReference", "ResponseOtherItem",
    } == branches("ResponseInputItem")  # fmt: skip
    assert {"ResponseInputText", "ResponseInputImage", "ResponseRefusal"} == branches(
        "ResponseContentPart"
    )
