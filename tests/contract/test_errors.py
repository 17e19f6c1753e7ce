"""Every error a caller can get: its status, the SDK's exception class, and the envelope."""

from __future__ import annotations

from decimal import Decimal

import openai
import pytest
import requests

from app.auth.keys import generate_key

HELLO = [{"role": "user", "content": "hello"}]


def envelope_of(error: openai.APIStatusError) -> dict:
    body = error.response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "code", "param"}
    return body["error"]


@pytest.mark.parametrize(
    "key",
    [
        "not-a-key",
        "sk-gw-tooshort",
        generate_key(),  # well-formed, never issued
    ],
)
def test_missing_malformed_or_unknown_keys_are_401(make_client, key):
    with pytest.raises(openai.AuthenticationError) as caught:
        make_client(key).chat.completions.create(model="dev-chat", messages=HELLO)
    error = envelope_of(caught.value)
    assert caught.value.status_code == 401
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
    assert "incorrect api key" in error["message"].lower()


def test_no_authorization_header_is_401(live_server):
    response = requests.get(f"{live_server.url}/v1/models")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_revoked_key_is_403_and_rotated_key_fails_at_once(app, make_client, funded_key):
    from app.accounts.keys import revoke_key, rotate_key

    with app.app_context():
        rotated = rotate_key(funded_key.key_id)
    with pytest.raises(openai.AuthenticationError):
        make_client(funded_key.key).models.list()
    assert make_client(rotated.value).models.list().data
    with app.app_context():
        revoke_key(funded_key.key_id)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        make_client(rotated.value).chat.completions.create(model="dev-chat", messages=HELLO)
    assert caught.value.status_code == 403
    assert envelope_of(caught.value)["type"] == "invalid_request_error"


def test_out_of_credits_is_402(make_client, make_funded_key):
    broke = make_funded_key(Decimal("0"))
    with pytest.raises(openai.APIStatusError) as caught:
        make_client(broke.key).chat.completions.create(model="dev-chat", messages=HELLO)
    assert caught.value.status_code == 402
    error = envelope_of(caught.value)
    assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota")
    assert "insufficient credits" in error["message"].lower()


def test_402_says_what_the_balance_affords(make_client, make_funded_key):
    poor = make_funded_key(Decimal("0.0001"))
    client = make_client(poor.key)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="dev-chat", messages=HELLO, max_tokens=4000)
    message = envelope_of(caught.value)["message"]
    affordable = int(message.split("max_tokens to at most ")[1].split(",")[0])
    response = client.chat.completions.create(
        model="dev-chat", messages=HELLO, max_tokens=affordable
    )
    assert response.choices[0].message.content


def test_unknown_model_is_400_model_not_found(sdk):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="gpt-nonexistent", messages=HELLO)
    error = envelope_of(caught.value)
    assert (error["type"], error["code"]) == ("invalid_request_error", "model_not_found")
    assert "does not exist" in error["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"max_tokens": 100000}, "max_tokens"),
    ],
)
def test_invalid_parameters_are_400_naming_the_param(sdk, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="dev-chat-mini", messages=HELLO, **extra)
    error = envelope_of(caught.value)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_images_on_a_text_model_are_400(sdk):
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(
            model="dev-chat-mini", messages=[{"role": "user", "content": [image]}]
        )
    assert envelope_of(caught.value)["param"] == "messages[0].content[0]"


def test_unknown_fields_are_ignored(sdk):
    plain = sdk.chat.completions.create(model="dev-chat-mini", messages=HELLO, seed=7)
    unknown = sdk.chat.completions.create(
        model="dev-chat-mini",
        messages=HELLO,
        seed=7,
        extra_body={"frobnicate": True, "metadata": {"a": 1}},
    )
    # The same answer, and the same tokens billed: the unknown fields went nowhere.
    assert unknown.choices[0].message.content == plain.choices[0].message.content
    assert unknown.usage.prompt_tokens == plain.usage.prompt_tokens
    assert unknown.usage.completion_tokens == plain.usage.completion_tokens


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        ("get", "/v1/nowhere", {}, 404, "not_found"),
        ("get", "/v1/chat/completions", {}, 405, "method_not_allowed"),
        ("post", "/v1/chat/completions", {"data": b"{not json"}, 400, "invalid_json"),
        (
            "post",
            "/v1/chat/completions",
            {"data": b"model=x", "headers": {"Content-Type": "application/x-www-form-urlencoded"}},
            415,
            "unsupported_media_type",
        ),
        (
            "post",
            "/v1/chat/completions",
            {"data": b"x" * (17 * 1024 * 1024)},
            413,
            "request_too_large",
        ),
        ("post", "/v1/chat/completions", {"json": ["not", "an", "object"]}, 400, None),
    ],
)
def test_http_errors_use_the_envelope(live_server, funded_key, method, path, kwargs, status, code):
    body = {name: value for name, value in kwargs.items() if name != "headers"}
    headers = {"Authorization": f"Bearer {funded_key.key}", **kwargs.get("headers", {})}
    response = requests.request(method, live_server.url + path, headers=headers, timeout=30, **body)
    assert response.status_code == status
    assert response.headers["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["type"] == "invalid_request_error"
    if code:
        assert error["code"] == code


def test_probes_need_no_key(live_server):
    assert requests.get(f"{live_server.url}/healthz").json() == {"status": "ok"}
    assert requests.get(f"{live_server.url}/readyz").json() == {"status": "ready"}


def test_a_key_sent_as_x_api_key_is_accepted_as_anthropics_sdks_send_it(live_server, funded_key):
    answer = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"x-api-key": funded_key.key},
        json={"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    refused = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"x-api-key": funded_key.key[:-1] + ("y" if funded_key.key.endswith("x") else "x")},
        json={"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert refused.status_code == 401
