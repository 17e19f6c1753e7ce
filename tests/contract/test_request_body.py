"""How a body is read: JSON however curl users send it, anything else refused with 415."""

from __future__ import annotations

import json
import subprocess

import pytest
import requests

BODY = json.dumps({"model": "dev-chat-mini", "messages": [{"role": "user", "content": "Hi"}]})


def test_curl_d_without_a_content_type_is_taken_as_json(live_server, funded_key):
    # curl -d sends application/x-www-form-urlencoded unless told otherwise.
    completed = subprocess.run(
        [
            "curl",
            "-sS",
            "-w",
            "\n%{http_code}",
            f"{live_server.url}/v1/chat/completions",
            "-H",
            f"Authorization: Bearer {funded_key.key}",
            "-d",
            BODY,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    body, status = completed.stdout.rsplit("\n", 1)
    assert status == "200", body
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["content"].startswith("Hi")
    assert answer["usage"]["cost"]["total_cost"] > 0


def test_a_body_without_content_type_is_taken_as_json(live_server, funded_key):
    request = requests.Request(
        "POST",
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded_key.key}"},
        data=BODY.encode(),
    ).prepare()
    assert "Content-Type" not in request.headers
    with requests.Session() as session:
        response = session.send(request, timeout=30)
    assert response.status_code == 200
    assert response.json()["object"] == "chat.completion"


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", "model=dev-chat-mini&messages=hi"),
        ("text/plain", BODY),
        ("multipart/form-data; boundary=x", BODY),
    ],
)
def test_other_bodies_and_types_are_415(live_server, funded_key, content_type, body):
    response = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded_key.key}", "Content-Type": content_type},
        data=body.encode(),
        timeout=30,
    )
    assert response.status_code == 415
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "unsupported_media_type")
