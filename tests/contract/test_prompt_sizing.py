"""Holds are sized from a cheap bound; the exact count decides only when it must."""

from __future__ import annotations

from decimal import Decimal

import openai
import pytest
import requests

from tests.contract.conftest import billing_records


def test_a_five_megabyte_word_does_not_pass_a_32k_context(app, live_server, funded_key):
    response = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded_key.key}"},
        json={"model": "dev-chat", "messages": [{"role": "user", "content": "x" * 5_000_000}]},
        timeout=60,
    )
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "more than 32768 tokens" in error["message"]
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert account.balance == Decimal("10") and not generations and not charges and not holds


def test_a_body_at_the_size_limit_is_refused_for_its_length(app, live_server, funded_key):
    words = ("lorem ipsum dolor sit amet " * 630_000)[: 16 * 1024 * 1024 - 200]
    body = {"model": "dev-chat-mini", "messages": [{"role": "user", "content": words}]}
    response = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded_key.key}"},
        json=body,
        timeout=60,
    )
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert billing_records(app, funded_key.account_id)[3] == []


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_that_fits_the_balance_only_by_its_exact_count_is_served(
    app, make_client, make_funded_key, stream
):
    # 2,000 words: about 2,000 tokens of dev-chat-mini, but 10,000 bytes. The balance
    # covers the exact worst case ($0.000307) and not the size bound ($0.0015).
    funded = make_funded_key(Decimal("0.0004"))
    reply = make_client(funded.key).chat.completions.create(
        model="dev-chat-mini",
        messages=[{"role": "user", "content": "word " * 2000}],
        max_tokens=10,
        stream=stream,
        stream_options={"include_usage": True} if stream else openai.NOT_GIVEN,
    )
    if stream:
        reply = list(reply)[-1]
    assert reply.usage.prompt_tokens > 2000
    account, (generation,), _, holds = billing_records(app, funded.account_id)
    assert [hold.status for hold in holds] == ["settled"] and account.reserved == 0
    assert account.balance == Decimal("0.0004") - generation.cost
