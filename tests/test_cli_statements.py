"""``flask ledger statement``: signed statements a holder checks with tools/verify_statement.py.

What is changed in a statement's file, and what is changed in the database after a
statement was signed, is found: by the verifier alone, by ``--after`` the statement
signed before, or by ``flask ledger verify``.
"""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import pytest
from sqlalchemy import select, text

from app.credits import grants, holds, settlement
from app.credits.chain_audit import fields_of
from app.credits.models import LedgerEntry
from app.database import utcnow
from app.extensions import db
from app.ledger_statements.signing import load_private_key, signed
from tests.factories import AccountFactory
from tests.statement_checks import new_signing_pem, public_pem_of, verify, write_json


def this_month() -> str:
    return utcnow().strftime("%Y-%m")


def charge(account_id: int, cost: str) -> None:
    held = holds.place_hold(account_id=account_id, amount=Decimal("1"), ttl_seconds=60)
    settlement.settle_hold(held, cost=Decimal(cost), generation_id=f"gen-{uuid.uuid4().hex}")


def new_account(app) -> tuple[int, str]:
    """Make an organisation with $1; return its id and name."""
    with app.app_context():
        account = AccountFactory.create(credits=Decimal("1"))
        return account.id, account.name


def write_entries(app, account_id: int, count: int = 3) -> None:
    """A grant and ``count - 1`` charges, through the ledger's own paths."""
    with app.app_context():
        grants.grant_credits(account_id=account_id, amount=Decimal("2"))
        for number in range(count - 1):
            charge(account_id, f"0.00{number + 1}")


@pytest.fixture
def signing_pem(app, monkeypatch):
    """The operator's key, set for the session's app."""
    pem = new_signing_pem()
    monkeypatch.setitem(app.config, "LEDGER_SIGNING_KEY", pem)
    return pem


@pytest.fixture
def key_file(tmp_path, signing_pem):
    """The operator's public key, as a holder saves it from /.well-known/ledger-key."""
    path = tmp_path / "ledger-key.pem"
    path.write_bytes(public_pem_of(signing_pem))
    return path


def statement_to(runner, account_id: int, path, period: str | None = None):
    """Write the account's statement of ``period`` (this month) to ``path``; return ``path``."""
    args = ["ledger", "statement", str(account_id), "--period", period or this_month()]
    result = runner.invoke(args=[*args, "--out", str(path)])
    assert result.exit_code == 0, result.output
    return path


def test_a_statement_verifies_and_the_next_one_extends_it(app, runner, key_file, tmp_path):
    account_id, name = new_account(app)
    write_entries(app, account_id)
    first = statement_to(runner, account_id, tmp_path / "first.json")
    checked = verify(first, "--key", key_file)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"valid: {first}: account {account_id}, {this_month()}, 4 ")

    write_entries(app, account_id, 2)
    printed = runner.invoke(args=["ledger", "statement", name, "--period", this_month()])
    assert printed.exit_code == 0, printed.stderr
    second = write_json(tmp_path / "second.json", json.loads(printed.stdout))
    assert len(json.loads(second.read_text())["entries"]) == 6
    extended = verify(second, "--after", first, "--key", key_file)
    assert extended.returncode == 0, extended.stderr
    assert f"it extends {first}" in extended.stdout
    # Switched, the earlier does not extend the later: its head is not among its entries.
    assert verify(first, "--after", second, "--key", key_file).returncode == 1


def test_wrong_input_gets_one_line_and_exit_1(app, runner, signing_pem, tmp_path):
    account_id, name = new_account(app)
    cases = {
        ("--period", "2026-13"): "is not a period",
        ("--period", "2999-01"): "has not begun",
        ("--period", "2026-11-02..2026-11-01"): "ends before it starts",
        ("--period", this_month(), "--out", str(tmp_path / "no" / "such.json")): "cannot write",
        (): "Missing option '--period'",
    }
    for options, message in cases.items():
        result = runner.invoke(args=["ledger", "statement", str(account_id), *options])
        assert result.exit_code == 1, options
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("Error: ") and message in line, line
    unknown = runner.invoke(args=["ledger", "statement", "no such org", "--period", "2026-01"])
    assert unknown.exit_code == 1 and "no organisation" in unknown.stderr


def test_production_without_a_key_signs_nothing(app, runner, monkeypatch):
    monkeypatch.setitem(app.config, "LEDGER_SIGNING_KEY", None)
    monkeypatch.setitem(app.config, "ENV_NAME", "production")
    account_id, name = new_account(app)
    result = runner.invoke(args=["ledger", "statement", str(account_id), "--period", "2026-01"])
    assert result.exit_code == 1 and result.stdout == ""
    assert "LEDGER_SIGNING_KEY" in result.stderr


def amount_changed(statement):
    statement["entries"][1]["amount_units"] -= 1
    return f"entry {statement['entries'][1]['id']}: its fields do not give its digest"


def entry_removed(statement):
    removed = statement["entries"].pop(1)
    return f"entry {statement['entries'][1]['id']} was chained after {removed['entry_hash']}"


def two_swapped(statement):
    entries = statement["entries"]
    entries[1], entries[2] = entries[2], entries[1]
    return f"entry {entries[2]['id']} comes after entry {entries[1]['id']}: the entries are out"


def signed_with_another_key(statement):
    """Signed anew, its key and key id those of the key that signed it: not the operator's."""
    other = load_private_key(new_signing_pem())
    unsigned = {k: v for k, v in statement.items() if k not in ("signature", "key_id")}
    statement.update(signed(unsigned, other))
    return f"it is signed with key {statement['key_id']}, not with the key given"


def signature_of_another_key(statement):
    other = signed(statement, load_private_key(new_signing_pem()))
    statement["signature"] = other["signature"]
    return "its signature does not match its contents"


@pytest.mark.parametrize(
    "tamper",
    [amount_changed, entry_removed, two_swapped, signed_with_another_key, signature_of_another_key],
)
def test_a_statement_changed_after_signing_is_refused_naming_what(
    app, runner, key_file, tmp_path, tamper
):
    account_id, name = new_account(app)
    write_entries(app, account_id)
    path = statement_to(runner, account_id, tmp_path / "statement.json")
    statement = json.loads(path.read_text())
    problem = tamper(statement)
    write_json(path, statement)
    checked = verify(path, "--key", key_file)
    assert checked.returncode == 1 and checked.stdout == ""
    assert checked.stderr.startswith(f"invalid: {path}: ")
    assert problem in checked.stderr, checked.stderr


@pytest.fixture
def tamperable(disposable_app, tmp_path):
    """An account's ledger on a database of its own, open to UPDATE and DELETE.

    Its four entries are in its statement of this month, signed: (app, account id,
    the statement's file, the public key's file).
    """
    pem = new_signing_pem()
    disposable_app.config["LEDGER_SIGNING_KEY"] = pem
    key_file = tmp_path / "ledger-key.pem"
    key_file.write_bytes(public_pem_of(pem))
    account_id, _ = new_account(disposable_app)
    write_entries(disposable_app, account_id)
    runner = disposable_app.test_cli_runner()
    signed_before = statement_to(runner, account_id, tmp_path / "signed-before.json")
    with disposable_app.app_context():
        if db.engine.dialect.name == "postgresql":
            db.session.execute(text("ALTER TABLE ledger_entries DISABLE TRIGGER USER"))
        else:
            db.session.execute(text("DROP TRIGGER ledger_entries_no_update"))
            db.session.execute(text("DROP TRIGGER ledger_entries_no_delete"))
        db.session.commit()
    return disposable_app, account_id, signed_before, key_file


def sql(app, statement: str, **parameters) -> None:
    with app.app_context():
        db.session.execute(text(statement), parameters)
        db.session.commit()


def entry_ids(app, account_id: int) -> list[int]:
    with app.app_context():
        ids = db.session.scalars(
            select(LedgerEntry.id)
            .where(LedgerEntry.account_id == account_id)
            .order_by(LedgerEntry.id)
        ).all()
        db.session.commit()
        return list(ids)


def rechain(app, account_id: int) -> None:
    """Chain the account's entries anew from their (changed) amounts, as a forger would.

    Balances, digests, the account's head and balance all made to agree.
    """
    with app.app_context():
        entries = db.session.scalars(
            select(LedgerEntry).where(LedgerEntry.account_id == account_id).order_by(LedgerEntry.id)
        ).all()
        previous, balance = "0" * 64, Decimal(0)
        for entry in entries:
            balance += entry.amount
            entry.balance_after, entry.previous_hash = balance, previous
            entry.entry_hash = previous = fields_of(entry).digest()
        db.session.flush()
        db.session.execute(
            text("UPDATE accounts SET balance = :balance, ledger_head = :head WHERE id = :id"),
            {"balance": int(balance * 10**10), "head": previous, "id": account_id},
        )
        db.session.commit()


def after_tampering(app, account_id: int, signed_before, key_file, tmp_path):
    """Add an entry as the ledger would, sign this month again; return both checks of it."""
    write_entries(app, account_id, 1)
    signed_now = statement_to(app.test_cli_runner(), account_id, tmp_path / "signed-now.json")
    alone = verify(signed_now, "--key", key_file)
    extends = verify(signed_now, "--after", signed_before, "--key", key_file)
    chains = app.test_cli_runner().invoke(args=["ledger", "verify", "--account", str(account_id)])
    return alone, extends, chains


def test_an_amount_changed_in_sql_is_found(tamperable, tmp_path):
    app, account_id, signed_before, key_file = tamperable
    changed = entry_ids(app, account_id)[2]
    sql(app, "UPDATE ledger_entries SET amount = amount + 1 WHERE id = :id", id=changed)
    alone, extends, chains = after_tampering(app, account_id, signed_before, key_file, tmp_path)
    assert alone.returncode == 1
    assert f"entry {changed}: its fields do not give its digest" in alone.stderr
    assert extends.returncode == 1
    assert chains.exit_code == 1 and f"entry {changed}: it differs" in chains.output


def test_an_amount_changed_and_the_chain_forged_anew_is_found_by_the_statement_before(
    tamperable, tmp_path
):
    app, account_id, signed_before, key_file = tamperable
    changed = entry_ids(app, account_id)[2]
    sql(app, "UPDATE ledger_entries SET amount = amount + 10000 WHERE id = :id", id=changed)
    rechain(app, account_id)
    alone, extends, chains = after_tampering(app, account_id, signed_before, key_file, tmp_path)
    # The database agrees with itself, and so does the new statement: only the one
    # signed before can tell.
    assert chains.exit_code == 0, chains.output
    assert alone.returncode == 0, alone.stderr
    assert extends.returncode == 1
    assert f"entry {changed} differs from the earlier statement's" in extends.stderr
    assert "it does not extend the earlier statement" in extends.stderr


def test_an_entry_deleted_in_sql_is_found(tamperable, tmp_path):
    app, account_id, signed_before, key_file = tamperable
    ids = entry_ids(app, account_id)
    sql(app, "DELETE FROM ledger_entries WHERE id = :id", id=ids[1])
    alone, extends, chains = after_tampering(app, account_id, signed_before, key_file, tmp_path)
    assert alone.returncode == 1
    assert f"entry {ids[2]} was chained after" in alone.stderr
    assert extends.returncode == 1
    assert chains.exit_code == 1
    assert f"entry {ids[2]}: the entry it was chained after is missing" in chains.output


def test_the_tail_cut_after_the_last_statement_is_found(tamperable, tmp_path):
    app, account_id, signed_before, key_file = tamperable
    ids = entry_ids(app, account_id)
    # The last two entries the statement signed are removed, the account's head and
    # balance put back to what the entry before them left: the database agrees again.
    sql(
        app,
        "DELETE FROM ledger_entries WHERE id >= :id AND account_id = :a",
        id=ids[2],
        a=account_id,
    )
    rechain(app, account_id)
    alone, extends, chains = after_tampering(app, account_id, signed_before, key_file, tmp_path)
    assert chains.exit_code == 0, chains.output
    assert alone.returncode == 0, alone.stderr
    assert extends.returncode == 1
    before = json.loads(signed_before.read_text())
    assert f"the earlier's closing head {before['closing_hash']} is" in extends.stderr
