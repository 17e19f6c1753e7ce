"""The doors every write goes through: a write's steps, or the same write as one statement."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.database import runs_alone, write_transaction


def test_a_write_offered_as_one_statement_runs_it_where_statements_run_alone(app_context):
    ran = []

    result = write_transaction(
        lambda connection: ran.append("steps") or "steps",
        alone=lambda: ran.append("alone") or "alone",
    )

    expected = "alone" if runs_alone() else "steps"
    assert (result, ran) == (expected, [expected])


def test_a_statement_that_declines_leaves_the_write_to_its_steps(app_context):
    ran = []

    result = write_transaction(
        lambda connection: ran.append("steps") or "steps",
        alone=lambda: ran.append("alone") and None,
    )

    assert result == "steps"
    assert ran == (["alone", "steps"] if runs_alone() else ["steps"])


def test_a_transaction_commits_its_steps_or_none_of_them(app_context):
    def steps(connection) -> None:
        connection.execute(text("CREATE TABLE IF NOT EXISTS door_notes (word TEXT)"))
        connection.execute(text("INSERT INTO door_notes (word) VALUES ('kept')"))

    def failing(connection) -> None:
        connection.execute(text("INSERT INTO door_notes (word) VALUES ('undone')"))
        raise ValueError("a step refused")

    write_transaction(steps)
    with pytest.raises(ValueError, match="a step refused"):
        write_transaction(failing)

    words = write_transaction(
        lambda connection: [
            row[0] for row in connection.execute(text("SELECT word FROM door_notes"))
        ]
    )
    write_transaction(lambda connection: connection.execute(text("DROP TABLE door_notes")))
    assert words == ["kept"]
