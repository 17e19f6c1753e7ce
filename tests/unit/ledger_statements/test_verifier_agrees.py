"""The standalone verifier's digest and signed form are the app's, on real entries."""

from __future__ import annotations

import importlib.util
import json
import uuid
from datetime import timedelta
from decimal import Decimal

from sqlalchemy import select

from app.credits import grants, holds, settlement
from app.credits.chain_audit import fields_of
from app.credits.models import LedgerEntry
from app.database import utcnow, write_transaction
from app.extensions import db
from app.ledger_statements.periods import Period
from app.ledger_statements.signing import canonical_bytes, load_private_key, signed
from app.ledger_statements.statement import build_statement, organisation
from tests.factories import AccountFactory
from tests.statement_checks import VERIFIER, new_signing_pem, verify, write_json

spec = importlib.util.spec_from_file_location("verify_statement", VERIFIER)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


def write_entries(account_id: int) -> None:
    """Entries of every kind, with references that need the canonical text's lengths."""
    grants.grant_credits(account_id=account_id, amount=Decimal("5"), idempotency_key="é|1:x")
    write_transaction(
        lambda connection: grants.take_back_within(
            connection,
            account_id=account_id,
            amount=Decimal("0.0000000001"),
            idempotency_key="refund:ü",
            description="refund",
        )
    )
    held = holds.place_hold(account_id=account_id, amount=Decimal("1"), ttl_seconds=60)
    settlement.settle_hold(
        held, cost=Decimal("0.1234567891"), generation_id=f"gen-ü|{uuid.uuid4().hex}"
    )


def test_the_verifier_computes_the_chain_s_text_and_digest(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    write_entries(account.id)
    now = utcnow()
    period = Period("now", now - timedelta(days=1), now + timedelta(seconds=1))
    statement = build_statement(account=organisation(account.id), period=period, now=now)
    rows = db.session.scalars(
        select(LedgerEntry).where(LedgerEntry.account_id == account.id).order_by(LedgerEntry.id)
    ).all()
    assert [entry["id"] for entry in statement["entries"]] == [row.id for row in rows]
    assert len(rows) == 4
    for entry, row in zip(statement["entries"], rows, strict=True):
        assert tool.entry_text(entry) == fields_of(row).text()
        assert tool.entry_digest(entry) == row.entry_hash
    assert tool.chain_problems(statement) == []


def test_the_verifier_checks_what_the_app_signs(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    write_entries(account.id)
    now = utcnow()
    period = Period("now", now - timedelta(days=1), now + timedelta(seconds=1))
    statement = signed(
        build_statement(account=organisation(account.id), period=period, now=now),
        load_private_key(new_signing_pem()),
    )
    assert tool.canonical_bytes(statement) == canonical_bytes(statement)
    assert tool.signature_problems(statement, None) == []
    statement["entries"][0]["reference"] = "é|1:y"
    assert tool.signature_problems(statement, None) != []


def test_statements_of_consecutive_periods_meet_at_one_head(app_context, tmp_path):
    account = AccountFactory.create(credits=Decimal("1"))
    write_entries(account.id)
    rows = db.session.scalars(
        select(LedgerEntry).where(LedgerEntry.account_id == account.id).order_by(LedgerEntry.id)
    ).all()
    split, now = rows[2].created_at, utcnow()
    key = load_private_key(new_signing_pem())
    files = []
    for name, period in (
        ("earlier", Period("earlier", now - timedelta(days=1), split)),
        ("later", Period("later", split, now + timedelta(seconds=1))),
    ):
        statement = build_statement(account=organisation(account.id), period=period, now=now)
        files.append(write_json(tmp_path / f"{name}.json", signed(statement, key)))
    earlier, later = (json.loads(path.read_text()) for path in files)
    assert [entry["id"] for entry in earlier["entries"] + later["entries"]] == [r.id for r in rows]
    assert later["opening_hash"] == earlier["closing_hash"] == rows[1].entry_hash
    assert later["opening_balance_units"] == earlier["closing_balance_units"]
    extended = verify(files[1], "--after", files[0])
    assert extended.returncode == 0, extended.stderr
    # Without the entries between them, the statements do not meet.
    first = build_statement(
        account=organisation(account.id),
        period=Period("first", split - timedelta(days=1), rows[1].created_at),
        now=now,
    )
    gap = write_json(tmp_path / "first.json", signed(first, key))
    assert verify(files[1], "--after", gap).returncode == 1
