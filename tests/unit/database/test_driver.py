"""Statements handed to the driver directly read and fail as SQLAlchemy's own execution."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from sqlalchemy import Integer, bindparam, insert, select, text, update
from sqlalchemy.exc import IntegrityError, InvalidRequestError

from app.accounts.keys import create_key, update_key_limits
from app.auth.keys import find_caller
from app.credits.models import Account, Hold, LedgerEntry
from app.database import execute_alone, execute_on_driver, fetch_on_driver
from app.database.driver import driver_form
from app.extensions import db
from tests.factories import AccountFactory

_ACCOUNT = select(Account.id, Account.balance, Account.created_at, Account.email).where(
    Account.id == bindparam("account_id")
)


def test_rows_read_on_the_driver_are_typed_as_sqlalchemy_types_them(app_context):
    account = AccountFactory.create(credits=Decimal("1.2345678901"))
    issued = create_key(account_id=account.id, name="typed")
    update_key_limits(issued.id, permitted_models=["dev-chat-mini"], monthly_limit=Decimal("2.5"))

    with db.engine.connect() as connection:
        (driven,) = fetch_on_driver(connection, _ACCOUNT, {"account_id": account.id})
        (executed,) = connection.execute(_ACCOUNT, {"account_id": account.id}).all()
    assert tuple(driven) == tuple(executed)
    assert driven.balance == Decimal("1.2345678901") and driven.created_at.tzinfo is UTC

    caller = find_caller(issued.value)  # prepared on PostgreSQL
    assert caller.permitted_models == frozenset({"dev-chat-mini"})
    assert caller.account_id == account.id


def test_a_textual_statement_reads_its_rows_as_the_driver_gives_them(app_context):
    assert [tuple(row) for row in execute_alone(text("SELECT 1, 'a'"), {})] == [(1, "a")]


def test_a_write_on_the_driver_counts_its_rows_and_keeps_its_transaction(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    credit = (
        update(Account)
        .where(Account.id == bindparam("account_id"))
        .values(reserved=Account.reserved + bindparam("amount", type_=Account.reserved.type))
    )
    with db.engine.connect() as connection, connection.begin() as transaction:
        assert execute_on_driver(connection, credit, {"account_id": account.id, "amount": 1}) == 1
        assert execute_on_driver(connection, credit, {"account_id": -1, "amount": 1}) == 0
        transaction.rollback()
    db.session.expire_all()
    assert db.session.get(Account, account.id).reserved == 0


def test_a_failed_write_on_the_driver_raises_as_sqlalchemy_raises_it(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    entry = {
        "account_id": account.id,
        "kind": "charge",
        "amount": Decimal("-0.1"),
        "generation_id": "gen-twice",
        "idempotency_key": None,
        "description": None,
        "created_at": datetime.now(UTC),
    }
    with db.engine.connect() as connection, connection.begin() as transaction:
        execute_on_driver(connection, insert(LedgerEntry), entry)
        with pytest.raises(IntegrityError):
            execute_on_driver(connection, insert(LedgerEntry), entry)
        # Nothing of the test stays behind: its transaction is undone.
        transaction.rollback()


def test_parameters_are_sent_as_sqlalchemy_would_send_them(app_context):
    settle = (
        update(Hold)
        .where(Hold.id == bindparam("hold_id"), Hold.status == "open")
        .values(status="settled", amount=bindparam("amount", type_=Hold.amount.type))
    )
    dialect = db.engine.dialect
    form = driver_form(settle, dialect, ("hold_id", "amount"))
    parameters = {"hold_id": "h-1", "amount": Decimal("0.25")}

    assert form.slots is not None
    by_sqlalchemy = dataclasses.replace(form, slots=None).arguments(parameters)
    assert form.arguments(parameters) == by_sqlalchemy
    assert "settled" in tuple(by_sqlalchemy) or "settled" in dict(by_sqlalchemy).values()
    with pytest.raises(InvalidRequestError):
        form.arguments({"amount": Decimal("1")})


def test_a_value_the_text_uses_twice_is_sent_and_bound_once(app_context):
    twice = select(
        (bindparam("n", type_=Integer()) + bindparam("n", type_=Integer())).label("sum"),
        (bindparam("n", type_=Integer()) * bindparam("n", type_=Integer())).label("square"),
    )
    with db.engine.connect() as connection:
        form = driver_form(twice, connection.dialect, ("n",))
        (row,) = fetch_on_driver(connection, twice, {"n": 2})
    assert form.names == ("n",)
    assert form.arguments({"n": 2}) in ({"n": 2}, (2,))
    assert (row.sum, row.square) == (4, 4)
