"""Signed statements over real HTTP: the public key, the list, a month, a range of days.

A holder saves what the service answers and checks it with tools/verify_statement.py
against the key served at /.well-known/ledger-key, without the operator's database.
"""

from __future__ import annotations

import base64
import hashlib

import pytest
import requests
from cryptography.hazmat.primitives import serialization

from app.database import utcnow
from app.ledger_statements.periods import month_period
from tests.conftest import running_server
from tests.statement_checks import new_signing_pem, public_pem_of, verify

HELLO = {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture(scope="module")
def signing_pem() -> str:
    """The operator's LEDGER_SIGNING_KEY."""
    return new_signing_pem()


@pytest.fixture(scope="module")
def gateway(app, database_url, tmp_path_factory, signing_pem):
    """The service with the operator's signing key set, as production runs it."""
    folder = tmp_path_factory.mktemp("statements")
    with running_server(database_url, folder, LEDGER_SIGNING_KEY=signing_pem) as server:
        yield server.url


def get(url: str, key: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.get(url, headers=headers, timeout=30)


def chat(gateway: str, key: str) -> None:
    response = requests.post(
        f"{gateway}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json=HELLO,
        timeout=30,
    )
    assert response.status_code == 200, response.text


def test_the_public_key_is_served_with_its_id(gateway, signing_pem):
    response = get(f"{gateway}/.well-known/ledger-key")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/x-pem-file"
    assert response.content == public_pem_of(signing_pem)
    raw = serialization.load_pem_public_key(response.content).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert response.headers["Ledger-Key-Id"] == hashlib.sha256(raw).hexdigest()


def test_a_month_s_statement_verifies_and_a_later_range_extends_it(gateway, funded_key, tmp_path):
    key_file = tmp_path / "ledger-key.pem"
    key_file.write_bytes(get(f"{gateway}/.well-known/ledger-key").content)
    chat(gateway, funded_key.key)
    now = utcnow()
    month = month_period(now.year, now.month)
    listed = get(f"{gateway}/v1/statements", funded_key.key)
    assert listed.status_code == 200
    assert listed.json()["data"] == [
        {
            "period": month.label,
            "from": f"{month.label}-01T00:00:00Z",
            "to": month.end.strftime("%Y-%m-%dT00:00:00Z"),
            "complete": False,
        }
    ]

    answered = get(f"{gateway}/v1/statements/{month.label}", funded_key.key)
    assert answered.status_code == 200 and answered.headers["Content-Type"] == "application/json"
    statement = answered.json()
    assert statement["account_id"] == funded_key.account_id
    assert [entry["kind"] for entry in statement["entries"]] == ["grant", "charge"]
    assert (
        statement["key_id"] == hashlib.sha256(base64.b64decode(statement["public_key"])).hexdigest()
    )
    first = tmp_path / "month.json"
    first.write_bytes(answered.content)
    checked = verify(first, "--key", key_file)
    assert checked.returncode == 0, checked.stderr

    chat(gateway, funded_key.key)
    today = utcnow().date().isoformat()
    later = tmp_path / "today.json"
    later.write_bytes(get(f"{gateway}/v1/statements/{today}..{today}", funded_key.key).content)
    extended = verify(later, "--after", first, "--key", key_file)
    assert extended.returncode == 0, extended.stderr
    assert "3 entries" in extended.stdout


@pytest.mark.parametrize(
    "period",
    [
        "2026-13",
        "2026-1",
        "11-2026",
        "2026-02-30..2026-03-01",
        "2999-01",
        "2026-11-01..",
        "x" * 300,
    ],
)
def test_a_period_that_is_none_is_400_in_the_envelope(gateway, funded_key, period):
    response = get(f"{gateway}/v1/statements/{period}", funded_key.key)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_period",
        "period",
    )
    assert "period" in error["message"]


def test_statements_need_a_key(gateway):
    for path in ("/v1/statements", "/v1/statements/2026-01"):
        response = get(f"{gateway}{path}")
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"


def test_production_without_a_key_refuses_statements_with_503(
    app, database_url, tmp_path, funded_key
):
    production = {"APP_ENV": "production", "SECRET_KEY": "production-secret-for-this-test"}
    with running_server(database_url, tmp_path, **production) as server:
        for path in ("/.well-known/ledger-key", "/v1/statements/2026-01"):
            response = get(f"{server.url}{path}", funded_key.key)
            assert response.status_code == 503
            error = response.json()["error"]
            assert error["code"] == "statements_unavailable"
            assert "LEDGER_SIGNING_KEY" in error["message"]
        assert get(f"{server.url}/v1/statements", funded_key.key).status_code == 200
