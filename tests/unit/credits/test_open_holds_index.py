"""The queries that look for open holds read the index of open holds, not every hold."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import event

from app.credits import balances, expiry
from app.credits.sql import settlement as settlement_sql
from app.database.driver import driver_form
from app.extensions import db


def plans_of(work: Callable[[], object]) -> list[str]:
    """Run ``work``; return SQLite's plan of each holds query it ran."""
    queries: list[tuple[str, object]] = []

    def note(connection, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "holds" in statement:
            queries.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", note)
    try:
        work()
    finally:
        event.remove(db.engine, "before_cursor_execute", note)
    with db.engine.connect() as connection:
        return [
            " ".join(row[-1] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", p))
            for sql, p in queries
        ]


@pytest.mark.parametrize(
    "work",
    [
        lambda: expiry.release_expired_holds(),
        lambda: expiry.release_expired_holds(account_id=1),
        lambda: balances.open_holds_summary(),
    ],
    ids=["sweeper", "sweeper-for-an-account", "open-holds-gauge"],
)
def test_queries_for_open_holds_use_their_index(app_context, work):
    if db.engine.dialect.name != "sqlite":
        pytest.skip("SQLite's planner uses an index whatever the table's size")

    plans = plans_of(work)

    assert plans and all("ix_holds_open_expires_at" in plan for plan in plans), plans


def test_a_settlement_finds_its_hold_by_its_id_whatever_is_open(app_context):
    # A generic plan that read the index of open holds would read every open hold for
    # the one it closes.
    if db.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL plans a prepared statement once for every value")
    settlement = settlement_sql.settlement_in_one_statement(False, False, None, False)
    with db.engine.connect() as connection:
        form = driver_form(settlement, connection.dialect)
        connection.exec_driver_sql(f"PREPARE settlement_plan AS {form.text}")
        connection.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        nulls = ", ".join(["NULL"] * len(form.names))
        plan = connection.exec_driver_sql(f"EXPLAIN EXECUTE settlement_plan({nulls})").all()
        connection.rollback()
    closing = next(row[0] for row in plan if "on holds" in row[0] and "Scan" in row[0])
    assert "pk_holds" in closing, plan
