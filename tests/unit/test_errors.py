"""Errors are answered in the envelope of the door whose path the request hit."""

from __future__ import annotations

import pytest
from flask import Flask

from app.errors import APIError, error_response, register_envelope, rendered


class Refused(APIError):
    status = 402
    type = "insufficient_quota"
    code = "insufficient_quota"


@pytest.fixture
def door_app() -> Flask:
    app = Flask(__name__)
    register_envelope(
        app,
        "/v1/messages",
        lambda error: (error.status, {"type": "error", "error": {"message": error.message}}),
    )
    return app


def test_a_path_under_a_doors_prefix_gets_its_envelope(door_app):
    with door_app.test_request_context("/v1/messages/count_tokens"):
        response = error_response(Refused("no credits"), {"retry-after": "1"})

    assert response.status_code == 402
    assert response.get_json() == {"type": "error", "error": {"message": "no credits"}}
    assert response.headers["retry-after"] == "1"


def test_any_other_path_gets_openais_envelope(door_app):
    with door_app.test_request_context("/v1/chat/completions"):
        status, body = rendered(Refused("no credits", param="max_tokens"))

    assert status == 402
    assert body == {
        "error": {
            "message": "no credits",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
            "param": "max_tokens",
        }
    }


def test_outside_a_request_the_envelope_is_openais(door_app):
    with door_app.app_context():
        assert rendered(Refused("no credits"))[1]["error"]["type"] == "insufficient_quota"
