"""The Balance page's statements: owners and admins download them as JSON and CSV.

The JSON verifies with tools/verify_statement.py; members, who do not see the ledger,
do not get its statements either.
"""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from app.database import utcnow
from app.money import usd_text
from tests.dashboard.test_organisations import create_key, team  # noqa: F401
from tests.statement_checks import new_signing_pem, public_pem_of, verify


@pytest.fixture
def signing_pem(app, monkeypatch):
    """The operator's key, set for the session's app."""
    pem = new_signing_pem()
    monkeypatch.setitem(app.config, "LEDGER_SIGNING_KEY", pem)
    return pem


def chat(client, key: str) -> None:
    body = {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hi"}]}
    response = client.post(
        "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 200


def test_owners_and_admins_download_statements_that_verify(app, team, signing_pem, tmp_path):  # noqa: F811
    owner, admin, member = team
    _, value = create_key(member.client, "laptop")
    chat(app.test_client(), value)
    month = utcnow().strftime("%Y-%m")
    page = owner.client.get("/balance").text
    links = re.findall(r'href="(/balance/statements/[^"]+)"', page)
    assert links[:2] == [f"/balance/statements/{month}.json", f"/balance/statements/{month}.csv"]

    downloaded = admin.client.get(links[0])
    assert downloaded.status_code == 200
    assert downloaded.headers["Content-Disposition"].startswith("attachment; filename=")
    path = tmp_path / "statement.json"
    path.write_bytes(downloaded.data)
    key_file = tmp_path / "key.pem"
    key_file.write_bytes(public_pem_of(signing_pem))
    checked = verify(path, "--key", key_file)
    assert checked.returncode == 0, checked.stderr

    statement = json.loads(downloaded.data)
    rows = list(csv.DictReader(io.StringIO(owner.client.get(links[1]).text)))
    assert [row["kind"] for row in rows] == ["opening", "grant", "charge", "closing"]
    for row, entry in zip(rows[1:-1], statement["entries"], strict=True):
        assert row["entry_hash"] == entry["entry_hash"]
        assert row["amount_usd"] == usd_text(entry["amount_units"])
    assert rows[-1]["entry_hash"] == statement["closing_hash"]
    assert rows[-1]["balance_after_usd"] == usd_text(statement["closing_balance_units"])


def test_members_see_neither_the_ledger_nor_its_statements(app, team, signing_pem):  # noqa: F811
    _, _, member = team
    month = utcnow().strftime("%Y-%m")
    assert "/balance/statements/" not in member.client.get("/balance").text
    for suffix in ("json", "csv"):
        assert member.client.get(f"/balance/statements/{month}.{suffix}").status_code == 403
