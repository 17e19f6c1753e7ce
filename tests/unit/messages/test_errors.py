"""The Messages door's errors: Anthropic's statuses and types for the gateway's errors."""

from __future__ import annotations

import pytest

from app.auth.errors import InvalidKey, KeyRevoked
from app.catalog.errors import ModelNotPermitted, UnknownModel
from app.credits.errors import InsufficientCredits
from app.errors import APIError, InvalidRequest
from app.generations.errors import ContextLengthExceeded
from app.generations.idempotency import IdempotencyKeyInUse
from app.messages.errors import render
from app.providers.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable
from app.ratelimits import RateLimited


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequest("messages is required."), 400, "invalid_request_error"),
        (InvalidKey(), 401, "authentication_error"),
        (InsufficientCredits(), 402, "billing_error"),
        (KeyRevoked(), 403, "permission_error"),
        (ModelNotPermitted("m"), 403, "permission_error"),
        (UnknownModel("m"), 404, "not_found_error"),
        (IdempotencyKeyInUse(), 409, "invalid_request_error"),
        (RateLimited("slow down"), 429, "rate_limit_error"),
        (APIError(code="server_error"), 500, "api_error"),
        (UpstreamError(), 502, "api_error"),
        (UpstreamTimeout(), 504, "timeout_error"),
        (UpstreamUnavailable(), 529, "overloaded_error"),
    ],
)
def test_each_error_gets_anthropics_status_and_type(error, status, kind):
    rendered_status, body = render(error)

    assert rendered_status == status
    message = error.message if not isinstance(error, InvalidKey) else body["error"]["message"]
    assert body == {"type": "error", "error": {"type": kind, "message": message}}


@pytest.mark.parametrize(
    ("sent_as", "said"),
    [
        (None, "the request sent no key"),
        ("Authorization", "does not say 'Bearer <key>'"),
        ("x-api-key", "the key sent as 'x-api-key' is not an active key"),
    ],
)
def test_a_refused_key_is_asked_for_in_either_header_this_door_reads(sent_as, said):
    message = render(InvalidKey(sent_as))[1]["error"]["message"]

    assert said in message
    assert message.endswith("'x-api-key: <key>' or 'Authorization: Bearer <key>'.")


def test_a_prompt_too_long_reads_as_anthropics_sentence_claude_code_compacts_on():
    error = ContextLengthExceeded("too long", param="messages", tokens=40000, limit=32768)

    assert render(error)[1]["error"]["message"] == (
        "prompt is too long: 40000 tokens > 32768 maximum"
    )
