"""Pooled database connections: bounded per worker; one lost while idle is replaced before use."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
import requests
import sqlalchemy
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from app import create_app
from app.credits import balances, holds, settlement
from app.credits.models import Hold, LedgerEntry
from app.database import (
    AUTOCOMMIT_ENGINE,
    KEPT_CONNECTIONS,
    PREPARED_STATEMENTS_LOST,
    execute_alone,
    write_transaction,
)
from app.database import connections as app_database
from app.extensions import db
from app.generations.models import Generation
from tests.conftest import TEST_CATALOG, running_server

# Named per test process: other runs of the suite may share the server, and these
# tests end the connections of this name.
APPLICATION_NAME = f"gateway-idle-ping-test-{os.getpid()}"
HELLO = {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def postgres_url(database_url: str) -> str:
    if not database_url.startswith("postgresql"):
        pytest.skip("only a database server can drop a pooled connection")
    return database_url


def app_pinging_after(database_url: str, idle_seconds: float):
    """The app on the test database, its connections named so that a test can drop them."""
    return create_app(
        "testing",
        {
            "SQLALCHEMY_DATABASE_URI": database_url,
            "MODEL_CATALOG": TEST_CATALOG,
            "SQLALCHEMY_ENGINE_OPTIONS": {"connect_args": {"application_name": APPLICATION_NAME}},
            "DATABASE_IDLE_PING_SECONDS": idle_seconds,
        },
    )


@pytest.fixture
def drop_connections(postgres_url: str) -> Iterator:
    """Return a function that ends the test app's server connections, as a restart would."""
    admin = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT")

    def backends(connection: sqlalchemy.Connection, query: str) -> int:
        rows = connection.execute(sqlalchemy.text(query), {"name": APPLICATION_NAME}).all()
        return len(rows)

    def drop() -> int:
        with admin.connect() as connection:
            dropped = backends(
                connection,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = :name",
            )
            # The server ends them asynchronously: wait until they are gone.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and backends(
                connection, "SELECT pid FROM pg_stat_activity WHERE application_name = :name"
            ):
                time.sleep(0.01)
        return dropped

    yield drop
    admin.dispose()


def complete(client, key: str):
    return client.post(
        "/v1/chat/completions", json=HELLO, headers={"Authorization": f"Bearer {key}"}
    )


def query_both_engines(app) -> None:
    """Run a statement on a pooled connection of each engine: the session's and the one alone."""
    with app.app_context():
        db.session.execute(sqlalchemy.text("SELECT 1"))
        db.session.commit()
        execute_alone(sqlalchemy.text("SELECT 1"), {})


def test_connections_lost_while_idle_are_replaced_before_use(
    postgres_url, drop_connections, funded_key
):
    app = app_pinging_after(postgres_url, idle_seconds=0.2)
    client = app.test_client()
    assert complete(client, funded_key.key).status_code == 200
    query_both_engines(app)

    assert drop_connections() >= 2
    time.sleep(0.3)

    query_both_engines(app)
    assert complete(client, funded_key.key).status_code == 200


def test_a_connection_lost_between_two_close_uses_costs_no_statement(
    postgres_url, drop_connections
):
    # Statements run alone are not pinged (a round trip per statement): the one that
    # meets a lost connection runs again on another. The session's engine pings its
    # connections before every use.
    app = app_pinging_after(postgres_url, idle_seconds=3600)
    with app.app_context():
        before = backend_pids(app)

    drop_connections()

    with app.app_context():
        after = backend_pids(app)
    # Both were replaced, and nothing failed.
    assert not set(after) & set(before)


def test_a_statement_run_again_does_not_meet_another_lost_connection(
    postgres_url, drop_connections
):
    # A server that ends its connections (a restart, pg_terminate_backend) ends the
    # pool's idle ones too: the second try of a statement that met one is not given
    # another, as the first was not pinged.
    app = app_pinging_after(postgres_url, idle_seconds=3600)
    engine = app.extensions[AUTOCOMMIT_ENGINE]
    opened = [engine.connect() for _ in range(2)]
    for connection in opened:
        connection.close()  # two idle in the pool, neither kept

    assert drop_connections() >= 2

    with app.app_context():
        assert execute_alone(sqlalchemy.text("SELECT 1"), {})[0][0] == 1


def test_a_transaction_whose_connection_is_lost_before_its_commit_runs_again(postgres_url):
    # Ended under it, after the ping before its use: nothing was applied, so it runs again.
    app = app_pinging_after(postgres_url, idle_seconds=3600)
    backends = []

    def work(connection: sqlalchemy.Connection) -> int:
        backends.append(connection.exec_driver_sql("SELECT pg_backend_pid()").scalar())
        if len(backends) == 1:
            connection.exec_driver_sql("SELECT pg_terminate_backend(pg_backend_pid())")
        return len(backends)

    with app.app_context():
        assert write_transaction(work) == 2
    assert backends[0] != backends[1]


def backend_pids(app) -> tuple[int, int]:
    """The server processes of a statement run alone and of one run in the session."""
    alone = execute_alone(sqlalchemy.text("SELECT pg_backend_pid()"), {})[0][0]
    in_session = db.session.scalar(sqlalchemy.text("SELECT pg_backend_pid()"))
    db.session.commit()
    return alone, in_session


def deallocate_prepared_statements(app) -> None:
    """Drop the prepared statements of the connection the next statement run alone uses.

    Sent through libpq itself, as if another client's: psycopg, which keeps the names
    it prepared, does not hear of it, as behind a pooler that moved the session.
    """
    kept = app.extensions[KEPT_CONNECTIONS]
    connection = kept.take()
    connection.connection.dbapi_connection.pgconn.exec_(b"DEALLOCATE ALL")
    kept.keep(connection)


def test_a_hold_survives_its_prepared_statement_going_missing(postgres_url, funded_key):
    # As behind PgBouncer in transaction mode, where EXECUTE may reach another server
    # session than PREPARE did.
    app = app_pinging_after(postgres_url, idle_seconds=10)
    client = app.test_client()
    assert complete(client, funded_key.key).status_code == 200
    deallocate_prepared_statements(app)

    assert complete(client, funded_key.key).status_code == 200
    assert app.extensions[PREPARED_STATEMENTS_LOST]
    assert complete(client, funded_key.key).status_code == 200


def test_a_worker_never_opens_more_connections_than_its_pool(postgres_url, funded_key, tmp_path):
    # A burst of requests much larger than the pool: they queue for its connections,
    # and none is opened beside them (each costs the server a process).
    name, pool_size, burst = f"gateway-pool-bound-test-{os.getpid()}", 2, 48
    url = sqlalchemy.make_url(postgres_url).update_query_dict({"application_name": name})
    admin = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    seen, done = [], threading.Event()

    def count_backends() -> None:
        with admin.connect() as connection:
            while not done.is_set():
                seen.append(
                    connection.execute(
                        sqlalchemy.text(
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"
                        ),
                        {"n": name},
                    ).scalar_one()
                )
                time.sleep(0.005)

    def ask(index: int) -> int:
        body = {**HELLO, "stream": index % 2 == 0}
        headers = {"Authorization": f"Bearer {funded_key.key}"}
        return requests.post(
            f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60
        ).status_code

    url_text = url.render_as_string(hide_password=False)
    with running_server(url_text, tmp_path, DATABASE_POOL_SIZE=str(pool_size)) as server:
        watcher = threading.Thread(target=count_backends)
        watcher.start()
        try:
            with ThreadPoolExecutor(burst) as pool:
                statuses = list(pool.map(ask, range(burst * 2)))
        finally:
            done.set()
            watcher.join()
    admin.dispose()

    assert statuses == [200] * burst * 2
    # Two engines on PostgreSQL: the session's and the one for statements run alone;
    # beside them, the worker's one listener for key changes (app.auth.caller_cache).
    assert 0 < max(seen) <= 2 * pool_size + 1, seen


def test_a_key_changed_while_the_key_listener_was_down_is_refused(
    postgres_url, drop_connections, funded_key
):
    # The listener for key changes is lost with the others: the change it could not
    # hear must not leave the key's caller remembered (app.auth.caller_cache).
    app = app_pinging_after(postgres_url, idle_seconds=0.2)
    client = app.test_client()
    assert complete(client, funded_key.key).status_code == 200

    assert drop_connections() >= 2
    admin = sqlalchemy.create_engine(postgres_url)
    with admin.begin() as connection:
        connection.execute(
            sqlalchemy.text("UPDATE api_keys SET state = 'revoked' WHERE id = :id"),
            {"id": funded_key.key_id},
        )
    admin.dispose()
    time.sleep(0.3)

    # A route that holds nothing: only the lookup can refuse the key there.
    refused = client.get("/v1/models", headers={"Authorization": f"Bearer {funded_key.key}"})
    assert refused.status_code == 403
    assert refused.get_json()["error"]["code"] == "api_key_revoked"


def test_behind_a_pooler_that_moves_sessions_no_caller_is_remembered(postgres_url, funded_key):
    # Found out by a prepared statement gone missing: the listener's session need not
    # be the one PostgreSQL notifies, so every key is looked up.
    app = app_pinging_after(postgres_url, idle_seconds=10)
    client = app.test_client()
    headers = {"Authorization": f"Bearer {funded_key.key}"}
    assert complete(client, funded_key.key).status_code == 200
    deallocate_prepared_statements(app)
    assert complete(client, funded_key.key).status_code == 200
    assert app.extensions[PREPARED_STATEMENTS_LOST]

    with app.extensions[AUTOCOMMIT_ENGINE].connect() as connection:
        connection.exec_driver_sql("ALTER TABLE api_keys DISABLE TRIGGER api_keys_changed")
        connection.execute(
            sqlalchemy.text("UPDATE api_keys SET state = 'revoked' WHERE id = :id"),
            {"id": funded_key.key_id},
        )
        connection.exec_driver_sql("ALTER TABLE api_keys ENABLE TRIGGER api_keys_changed")

    assert client.get("/v1/models", headers=headers).status_code == 403


def test_statements_run_alone_take_the_connection_the_last_one_used(postgres_url):
    app = app_pinging_after(postgres_url, idle_seconds=10)
    engine = app.extensions[AUTOCOMMIT_ENGINE]
    opened = [engine.connect() for _ in range(2)]
    for connection in opened:
        connection.close()  # two idle in the pool, which hands them out in turn
    backends = []
    with app.app_context():
        for _ in range(3):
            backends += execute_alone(sqlalchemy.text("SELECT pg_backend_pid()"), {})

    # Kept, not checked out and in again: that costs more than the statement.
    assert len(set(backends)) == 1, backends


def app_on(database_url: str):
    """A fresh app on the test database: its connections are this test's alone."""
    return create_app(
        "testing", {"SQLALCHEMY_DATABASE_URI": database_url, "MODEL_CATALOG": TEST_CATALOG}
    )


def test_statements_run_alone_keep_their_connection_out_of_the_pool(database_url):
    app = app_on(database_url)
    kept = app.extensions[KEPT_CONNECTIONS]
    checkouts = []
    sqlalchemy.event.listen(kept.engine, "checkout", lambda *_: checkouts.append(1))
    with app.app_context():
        answers = [execute_alone(sqlalchemy.text("SELECT 1"), {}) for _ in range(3)]

    assert answers == [[(1,)]] * 3
    # One checkout for three statements, on SQLite as on PostgreSQL.
    assert len(checkouts) == 1, checkouts


def test_a_connection_goes_back_when_the_pool_has_none_left(database_url):
    app = app_on(database_url)
    kept = app.extensions[KEPT_CONNECTIONS]
    pool = kept.engine.pool
    with app.app_context():
        taken = [kept.take() for _ in range(pool.size())]
        assert pool.checkedout() == pool.size()
        # Another statement could be waiting for this one in the pool: it goes back...
        kept.keep(taken.pop())
        assert pool.checkedout() == pool.size() - 1
        # ...while the others, with one free in the pool, are kept.
        for connection in taken:
            kept.keep(connection)
        assert pool.checkedout() == pool.size() - 1


def test_a_lost_connection_sends_back_every_kept_one(postgres_url, drop_connections):
    app = app_pinging_after(postgres_url, idle_seconds=3600)
    kept = app.extensions[KEPT_CONNECTIONS]
    with app.app_context():
        # Two statements at once: two connections, both kept afterwards.
        first, second = kept.take(), kept.take()
        kept.keep(first)
        kept.keep(second)

    drop_connections()

    # Without a ping, the first statement on a lost connection fails, and is run again
    # on another: not the other kept one (lost as well), which went back with the first.
    with app.app_context():
        connects = []
        sqlalchemy.event.listen(kept.engine, "connect", lambda *_: connects.append(1))
        assert execute_alone(sqlalchemy.text("SELECT 1"), {}) == [(1,)]
    assert len(connects) == 1


def test_a_statement_that_must_know_whether_it_ran_is_not_run_again(postgres_url, drop_connections):
    app = app_pinging_after(postgres_url, idle_seconds=3600)
    with app.app_context():
        execute_alone(sqlalchemy.text("SELECT 1"), {})

    drop_connections()

    with app.app_context(), pytest.raises(OperationalError):
        execute_alone(sqlalchemy.text("SELECT 1"), {}, again_if_lost=False)


@pytest.mark.parametrize("with_key", [True, False], ids=["keyed", "keyless"])
def test_a_hold_applied_whose_answer_was_lost_is_placed_once(
    postgres_url, funded_key, monkeypatch, with_key
):
    """The hold's statement commits, then its connection is lost before the answer arrives.

    The statement runs again and finds its own row: the request has its hold, reserved
    once, where the rerun used to fail on the row's id (a 500).
    """
    app = app_pinging_after(postgres_url, idle_seconds=3600)
    kept = app.extensions[KEPT_CONNECTIONS]
    run = kept.run
    lost: list[str] = []

    def applied_then_lost(statement, parameters, *, prepared):
        rows = run(statement, parameters, prepared=prepared)
        if "hold_id" in parameters and not lost:
            lost.append(parameters["hold_id"])
            error = Exception("server closed the connection unexpectedly")
            raise OperationalError("a hold", {}, error, connection_invalidated=True)
        return rows

    monkeypatch.setattr(kept, "run", applied_then_lost)
    amount = Decimal("0.5")
    with app.app_context():
        held = holds.place_hold(
            account_id=funded_key.account_id,
            amount=amount,
            ttl_seconds=60,
            key_id=funded_key.key_id if with_key else None,
            hold_id=f"chatcmpl-lost-answer-{with_key}",
        )
        money = balances.account_money(funded_key.account_id)
        statuses = db.session.scalars(
            select(Hold.status).where(Hold.account_id == funded_key.account_id)
        ).all()
        db.session.commit()

    assert lost == [held.id]
    assert isinstance(held, balances.HeldCredit) and held.amount == amount
    assert statuses == ["open"] and money.reserved == amount


def test_a_forked_process_keeps_none_of_its_parents_connections(postgres_url, monkeypatch):
    app = app_pinging_after(postgres_url, idle_seconds=10)
    with app.app_context():
        parents = execute_alone(sqlalchemy.text("SELECT pg_backend_pid()"), {})
        monkeypatch.setattr(app_database, "process_id", lambda: -1)
        childs = execute_alone(sqlalchemy.text("SELECT pg_backend_pid()"), {})

    assert parents != childs


def test_a_hang_ups_settlement_that_meets_a_lost_connection_still_charges(
    postgres_url, drop_connections, funded_key, monkeypatch, caplog
):
    monkeypatch.setattr(settlement, "SETTLE_RETRY_PAUSES", (0.01, 0.01))
    app = app_pinging_after(postgres_url, idle_seconds=3600)
    slow = {"model": "dev-slow", "messages": [{"role": "user", "content": "one two three four"}]}
    client = app.test_client()
    # The key's use is recorded now: the stream's settlement is then one statement,
    # run alone, which meets the lost connection itself.
    assert complete(client, funded_key.key).status_code == 200
    response = client.post(
        "/v1/chat/completions",
        json={**slow, "stream": True},
        headers={"Authorization": f"Bearer {funded_key.key}"},
        buffered=False,
    )
    events = response.iter_encoded()
    delivered = next(events) + next(events)
    assert delivered.count(b"data: {") >= 2

    drop_connections()
    # The caller hangs up: the server closes the stream, which settles on a lost connection.
    response.close()

    with app.app_context():
        status, tokens, cost = db.session.execute(
            select(Generation.status, Generation.completion_tokens, Generation.cost).where(
                Generation.account_id == funded_key.account_id, Generation.streamed.is_(True)
            )
        ).one()
        charges = db.session.scalars(
            select(LedgerEntry.amount).where(
                LedgerEntry.account_id == funded_key.account_id, LedgerEntry.kind == "charge"
            )
        ).all()
        db.session.commit()
    assert status == "cancelled" and tokens > 0
    assert len(charges) == 2 and -cost in charges and cost > 0
    retried = [r for r in caplog.records if "its settlement failed" in r.getMessage()]
    assert retried and all(r.request_id == response.headers["X-Request-Id"] for r in retried)
