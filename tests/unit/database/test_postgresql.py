"""Statements run alone on PostgreSQL are on disk when they return, beside others too.

Alone, a statement commits as the server is configured to; beside another, it commits
without waiting for the disk, then waits for a flush of the WAL, which the statements
waiting at once share.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import func, literal, select

from app.database import COMMIT_AS_CHOSEN, execute_alone
from app.database.postgresql import _FLUSH_WAL, DurableStatements
from app.extensions import db

FLUSH = "flush"


class FakeServer:
    """Runs statements as execute_alone would, and can keep any of them waiting.

    A statement is named by its ``name`` parameter; the flushes are numbered in order.
    """

    def __init__(self) -> None:
        self.ran: list[tuple[str, bool] | str] = []
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.failures: dict[str, BaseException] = {}
        self._flushes = 0

    def hold(self, name: str) -> None:
        self.gates[name] = threading.Event()
        self.started[name] = threading.Event()

    def release(self, name: str) -> None:
        self.gates[name].set()

    def __call__(self, statement: Any, parameters: dict[str, Any]) -> list[tuple[str]]:
        if statement is _FLUSH_WAL:
            self._flushes += 1
            name = f"{FLUSH} {self._flushes}"
            self.ran.append(name)
        else:
            name = parameters["name"]
            self.ran.append((name, parameters["commit_waits"]))
        if name in self.started:
            self.started[name].set()
            assert self.gates[name].wait(10)
        if name in self.failures:
            raise self.failures[name]
        return [(name,)]


class Outcomes:
    """Each statement's rows or error, from the threads that ran them."""

    def __init__(self, statements: DurableStatements) -> None:
        self.statements = statements
        self.results: dict[str, Any] = {}
        self.threads: dict[str, threading.Thread] = {}

    def start(self, name: str) -> None:
        def run() -> None:
            try:
                self.results[name] = self.statements.execute(select(literal(1)), {"name": name})
            except BaseException as error:  # noqa: BLE001 - the outcome under test
                self.results[name] = error

        self.threads[name] = threading.Thread(target=run, daemon=True)
        self.threads[name].start()

    def wait(self, name: str) -> Any:
        self.threads[name].join(10)
        assert not self.threads[name].is_alive(), f"{name} did not return"
        return self.results[name]

    def returned(self, name: str) -> bool:
        return name in self.results


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def waiting_for_a_flush(statements: DurableStatements) -> int:
    # threading.Condition's own list of the threads in its wait().
    return len(statements._flushed._waiters)


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
def outcomes(server: FakeServer) -> Iterator[Outcomes]:
    outcomes = Outcomes(DurableStatements(server))
    yield outcomes
    for gate in server.gates.values():
        gate.set()


def beside_a_running_statement(server: FakeServer, outcomes: Outcomes) -> None:
    server.hold("running")
    outcomes.start("running")
    assert server.started["running"].wait(10)


def two_waiting_behind_a_flush(server: FakeServer, outcomes: Outcomes) -> None:
    """Have "first" send the first flush (held), and "second" and "third" end meanwhile."""
    beside_a_running_statement(server, outcomes)
    server.hold(f"{FLUSH} 1")
    outcomes.start("first")
    assert server.started[f"{FLUSH} 1"].wait(10)
    # The flush on its way may have been sent before their commits: it does not cover them.
    outcomes.start("second")
    outcomes.start("third")
    wait_until(lambda: waiting_for_a_flush(outcomes.statements) == 2)


def test_a_statement_alone_commits_as_configured_and_sends_no_flush(server):
    statements = DurableStatements(server)

    assert statements.execute(select(literal(1)), {"name": "alone"}) == [("alone",)]
    assert server.ran == [("alone", True)]


def test_beside_another_a_statement_commits_without_waiting_and_returns_after_a_flush(
    server, outcomes
):
    beside_a_running_statement(server, outcomes)
    server.hold(f"{FLUSH} 1")
    outcomes.start("beside")
    assert server.started[f"{FLUSH} 1"].wait(10)

    assert server.ran == [("running", True), ("beside", False), f"{FLUSH} 1"]
    assert not outcomes.returned("beside")
    server.release(f"{FLUSH} 1")
    assert outcomes.wait("beside") == [("beside",)]
    server.release("running")
    assert outcomes.wait("running") == [("running",)]
    assert server.ran[-1] == f"{FLUSH} 1"


def test_statements_that_end_while_a_flush_runs_share_the_next_one(server, outcomes):
    two_waiting_behind_a_flush(server, outcomes)
    server.release(f"{FLUSH} 1")

    for name in ("first", "second", "third"):
        assert outcomes.wait(name) == [(name,)]
    assert [step for step in server.ran if isinstance(step, str)] == [f"{FLUSH} 1", f"{FLUSH} 2"]


def test_a_failed_flush_fails_every_statement_waiting_for_it(server, outcomes):
    two_waiting_behind_a_flush(server, outcomes)
    lost = ConnectionError("server closed the connection")
    server.failures[f"{FLUSH} 2"] = lost
    server.release(f"{FLUSH} 1")

    assert outcomes.wait("first") == [("first",)]
    assert outcomes.wait("second") is lost and outcomes.wait("third") is lost
    assert [step for step in server.ran if isinstance(step, str)] == [f"{FLUSH} 1", f"{FLUSH} 2"]
    outcomes.start("later")  # still beside the running statement: a flush of its own
    assert outcomes.wait("later") == [("later",)]
    assert server.ran[-1] == f"{FLUSH} 3"


class Killed(BaseException):
    """What a request's timeout raises in the greenlet it stops."""


def test_a_flush_whose_sender_was_stopped_is_sent_again_by_a_waiter(server, outcomes):
    two_waiting_behind_a_flush(server, outcomes)
    server.failures[f"{FLUSH} 2"] = Killed()
    server.release(f"{FLUSH} 1")

    assert outcomes.wait("first") == [("first",)]
    # Whichever of the two sent the second flush was stopped; the other sent a third.
    second, third = outcomes.wait("second"), outcomes.wait("third")
    assert sorted([isinstance(second, Killed), isinstance(third, Killed)]) == [False, True]
    assert [step for step in server.ran if isinstance(step, str)][-1] == f"{FLUSH} 3"


def test_on_postgresql_the_chosen_commit_and_the_flush_run_on_the_server(app):
    with app.app_context():
        if db.engine.dialect.name != "postgresql":
            pytest.skip("statements run alone and commit as chosen on PostgreSQL")
    ran: list[Any] = []

    def run(statement: Any, parameters: dict[str, Any]) -> Any:
        with app.app_context():
            rows = execute_alone(statement, parameters, prepared=True)
        ran.append((statement, rows))
        return rows

    statements = DurableStatements(run)
    slow = select(COMMIT_AS_CHOSEN, func.pg_sleep(0.5))
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(slow=statements.execute(slow, {})))
    thread.start()
    wait_until(lambda: statements._running == 1)

    beside = statements.execute(select(COMMIT_AS_CHOSEN), {})
    thread.join(10)

    assert beside[0][0] == "off"
    assert outcome["slow"][0][0] == "on"
    flushes = [rows for statement, rows in ran if statement is _FLUSH_WAL]
    assert len(flushes) == 1 and flushes[0][0][0] > 0
