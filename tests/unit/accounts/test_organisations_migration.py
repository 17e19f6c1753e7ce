"""Migration 0019 on a database the previous release filled: nothing is lost.

Balances, ledger, keys, passwords and generations, written as revision 0018 stores them,
all still work after the upgrade, and the audit is clean. A dashboard session of that
release names its person without the password mark sessions now carry: its holder signs
in once more (a session must end when its password changes, and that one cannot tell).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from decimal import Decimal

import pytest
from argon2 import PasswordHasher
from flask_migrate import upgrade
from sqlalchemy import column, insert, select, table, update

from app import create_app
from app.accounts.models import OWNER, Membership, Person
from app.auth.models import ApiKey
from app.credits.models import CHARGE, GRANT, Account
from app.database import utcnow
from app.extensions import db
from app.generations.audit import audit_ledger
from app.generations.rollups import rebuild_rollups
from tests.conftest import TEST_CATALOG, _fresh_postgres_database
from tests.dashboard.conftest import PASSWORD, new_client, post_form, sign_in
from tests.previous_release import (
    ACCOUNTS_AT_0018,
    LEDGER_ENTRIES_AT_0018,
    insert_account,
    insert_generation,
    insert_key,
)

ACCOUNT_PASSWORDS_AT_0018 = table(
    "account_passwords", column("account_id"), column("password_hash"), column("updated_at")
)
CHAT = {"model": "dev-chat", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def previous_release(database_url: str, tmp_path) -> Iterator:
    """An app on a database of its own, migrated to 0018, the previous release."""
    if database_url.startswith("sqlite"):
        urls: Iterator[str] = iter([f"sqlite:///{tmp_path / 'previous.sqlite3'}"])
    else:
        urls = _fresh_postgres_database(os.environ["TEST_DATABASE_URL"])
    # Requests run outside any app context of the test's: one shared with them would
    # share ``g``, where each request keeps its CSRF token.
    for url in urls:
        app = create_app("testing", {"SQLALCHEMY_DATABASE_URI": url, "MODEL_CATALOG": TEST_CATALOG})
        with app.app_context():
            upgrade(revision="0018")
        yield app
        with app.app_context():
            db.engine.dispose()


def fill_account(*, credits: str, spent: str, is_admin: bool = False) -> dict:
    """An account as 0018 keeps it: granted, charged once by a key, with a password."""
    email = f"holder-{uuid.uuid4().hex[:8]}@example.com"
    account_id = insert_account(email, is_admin=is_admin)
    key_id, value = insert_key(account_id, "ci")
    now = utcnow()
    generation = f"gen-{uuid.uuid4().hex}"
    insert_generation(
        id=generation, account_id=account_id, api_key_id=key_id, model="dev-chat",
        completion_tokens=1000, price_completion=Decimal(spent) * 1000, cost=Decimal(spent),
        status="completed", created_at=now,
    )  # fmt: skip
    db.session.execute(insert(LEDGER_ENTRIES_AT_0018), [
        dict(account_id=account_id, kind=GRANT, amount=Decimal(credits), generation_id=None,
             created_at=now),
        dict(account_id=account_id, kind=CHARGE, amount=-Decimal(spent),
             generation_id=generation, created_at=now),
    ])  # fmt: skip
    db.session.execute(
        update(ACCOUNTS_AT_0018)
        .where(ACCOUNTS_AT_0018.c.id == account_id)
        .values(balance=Decimal(credits) - Decimal(spent))
    )
    db.session.execute(
        insert(ACCOUNT_PASSWORDS_AT_0018).values(
            account_id=account_id, password_hash=PasswordHasher().hash(PASSWORD), updated_at=now
        )
    )
    db.session.commit()
    return {"id": account_id, "email": email, "key_id": key_id, "key": value,
            "generation": generation, "balance": Decimal(credits) - Decimal(spent)}  # fmt: skip


def test_the_upgrade_keeps_balances_keys_passwords_and_generations(previous_release):
    app = previous_release
    with app.app_context():
        holders = [fill_account(credits="5", spent="0.25"), fill_account(credits="2", spent="1")]
        operator = fill_account(credits="1", spent="0.5", is_admin=True)
        rebuild_rollups()
    session_client = new_client(app)
    with session_client.session_transaction() as cookie:
        cookie["_user_id"], cookie["_fresh"] = str(holders[0]["id"]), True

    with app.app_context():
        upgrade()

    old_session = session_client.get("/keys")
    assert old_session.status_code == 302, "a session without a password mark signs in again"
    assert "/signin" in old_session.headers["Location"]
    for holder in [*holders, operator]:
        _assert_holder_kept(app, holder)
    with app.app_context():
        person = db.session.scalar(select(Person).where(Person.email == operator["email"]))
        assert person.is_admin and person.id == operator["id"]
        report = audit_ledger(full=True)
    assert report.mismatches == [] and report.accounts == 3


def _assert_holder_kept(app, holder: dict) -> None:
    with app.app_context():
        account = db.session.get(Account, holder["id"])
        assert account.balance == holder["balance"] and account.name == holder["email"]
        owner = db.session.scalar(select(Membership).where(Membership.account_id == holder["id"]))
        assert (owner.person_id, owner.role, owner.removed_at) == (holder["id"], OWNER, None)
        assert db.session.get(ApiKey, holder["key_id"]).member_id == owner.id
    client = new_client(app)
    assert sign_in(client, holder["email"]).status_code == 302, "the password still signs in"
    assert holder["generation"] in client.get("/usage.csv").text, "its history is kept"
    headers = {"Authorization": f"Bearer {holder['key']}"}
    answered = app.test_client().post("/v1/chat/completions", json=CHAT, headers=headers)
    assert answered.status_code == 200, "the key still works"
    with app.app_context():
        assert db.session.get(Account, holder["id"]).balance < holder["balance"]


def test_people_made_after_the_upgrade_take_new_ids(previous_release):
    app = previous_release
    with app.app_context():
        first = fill_account(credits="1", spent="0")
        upgrade()
    email = f"new-{uuid.uuid4().hex[:8]}@example.com"
    signed_up = post_form(
        new_client(app), "/signup", "/signup", {"email": email, "password": PASSWORD}
    )
    assert signed_up.status_code == 302
    with app.app_context():
        person = db.session.scalar(select(Person).where(Person.email == email))
    assert person.id > first["id"]
