"""Request ids, log redaction and the trusted proxy hops, without a server."""

from __future__ import annotations

import json
import logging

import pytest
from werkzeug.test import Client
from werkzeug.wrappers import Response

from app.auth.keys import generate_key
from app.observability.logs import JsonFormatter, TextFormatter, redact
from app.observability.middleware import TrustedProxies
from app.observability.trace import accept_request_id


@pytest.mark.parametrize("sane", ["a", "req-1", "A.b:c_d-9", "x" * 128])
def test_a_sane_request_id_is_kept(sane):
    assert accept_request_id(sane) == sane


@pytest.mark.parametrize("insane", [None, "", "x" * 129, "a b", "a\nb", "a/b", "é", "{x}"])
def test_anything_else_gets_a_new_id(insane):
    made = accept_request_id(insane)
    assert made.startswith("req_") and len(made) == 28 and made != accept_request_id(insane)


@pytest.mark.parametrize(
    "secret", [generate_key(), "sk-proj-Abc123Def456Ghi789", "sk-ant-api03-Zx9_Yw8-Vu7Ts6"]
)
def test_key_shaped_strings_are_cut_to_their_prefix(secret):
    line = redact(f"GET /v1/{secret}?x=1 failed")

    assert secret[8:] not in line and "[redacted]" in line


@pytest.mark.parametrize("formatter", [TextFormatter(), JsonFormatter()])
def test_both_formats_redact(formatter):
    key = generate_key()
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "key %s", (key,), None)

    assert key[10:] not in formatter.format(record)


def test_a_json_line_carries_its_fields():
    record = logging.LogRecord("gateway.access", logging.INFO, __file__, 1, "m", (), None)
    record.fields = {"status": 200}
    record.request_id = "r-1"

    line = json.loads(JsonFormatter().format(record))

    assert (line["request_id"], line["status"], line["level"]) == ("r-1", 200, "info")


def remote_address(environ, start_response):
    return Response(environ["REMOTE_ADDR"])(environ, start_response)


@pytest.mark.parametrize(
    ("hops", "allowed", "peer", "seen"),
    [
        (0, "127.0.0.1", "127.0.0.1", "127.0.0.1"),  # no proxy configured: the peer
        (1, "127.0.0.1", "127.0.0.1", "10.0.0.2"),  # nginx's entry, not the caller's claim
        (2, "127.0.0.1", "127.0.0.1", "10.0.0.1"),
        (1, "127.0.0.1", "192.0.2.5", "192.0.2.5"),  # not a trusted proxy: header ignored
        (1, "*", "192.0.2.5", "10.0.0.2"),
    ],
)
def test_only_the_configured_hops_from_trusted_proxies_are_read(hops, allowed, peer, seen):
    client = Client(TrustedProxies(remote_address, hops=hops, allowed=allowed))

    response = client.get(
        "/", headers={"X-Forwarded-For": "10.0.0.1, 10.0.0.2"}, environ_base={"REMOTE_ADDR": peer}
    )

    assert response.get_data(as_text=True) == seen
