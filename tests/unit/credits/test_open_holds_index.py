"""The queries that look for open holds read the index of open holds, not every hold."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import event

from app.credits import holds, ledger
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
        lambda: ledger.release_expired_holds(),
        lambda: ledger.release_expired_holds(account_id=1),
        lambda: holds.open_holds_summary(),
    ],
    ids=["sweeper", "sweeper-for-an-account", "open-holds-gauge"],
)
def test_queries_for_open_holds_use_their_index(app_context, work):
    if db.engine.dialect.name != "sqlite":
        pytest.skip("SQLite's planner uses an index whatever the table's size")

    plans = plans_of(work)

    assert plans and all("ix_holds_open_expires_at" in plan for plan in plans), plans
