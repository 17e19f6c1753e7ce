"""Pooled database connections: bounded per worker; one lost while idle is replaced before use."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import sqlalchemy
from sqlalchemy.exc import OperationalError

from app import create_app
from app import database as app_database
from app.database import (
    AUTOCOMMIT_ENGINE,
    KEPT_CONNECTIONS,
    PREPARED_STATEMENTS_LOST,
    execute_alone,
)
from app.extensions import db
from tests.conftest import TEST_CATALOG, running_server

APPLICATION_NAME = "gateway-idle-ping-test"
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


def test_a_connection_used_again_soon_is_not_pinged(postgres_url, drop_connections):
    # The price of no round trip per checkout: a connection lost between two close uses
    # fails its next statement, and the engine's pool then starts afresh.
    app = app_pinging_after(postgres_url, idle_seconds=3600)
    query_both_engines(app)

    drop_connections()

    with app.app_context(), pytest.raises(OperationalError):
        execute_alone(sqlalchemy.text("SELECT 1"), {})
    with app.app_context(), pytest.raises(OperationalError):
        db.session.execute(sqlalchemy.text("SELECT 1"))
    query_both_engines(app)


def deallocate_prepared_statements(app) -> None:
    """Drop the prepared statements of the connection the next statement run alone uses."""
    kept = app.extensions[KEPT_CONNECTIONS]
    connection = kept.take()
    connection.exec_driver_sql("DEALLOCATE ALL")
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
    name, pool_size, burst = "gateway-pool-bound-test", 2, 48
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

    # As without a ping: the first statement on a lost connection fails...
    with app.app_context(), pytest.raises(OperationalError):
        execute_alone(sqlalchemy.text("SELECT 1"), {})
    # ...and takes the other kept one (lost as well) with it, not the next statement.
    with app.app_context():
        assert execute_alone(sqlalchemy.text("SELECT 1"), {}) == [(1,)]


def test_a_forked_process_keeps_none_of_its_parents_connections(postgres_url, monkeypatch):
    app = app_pinging_after(postgres_url, idle_seconds=10)
    with app.app_context():
        parents = execute_alone(sqlalchemy.text("SELECT pg_backend_pid()"), {})
        monkeypatch.setattr(app_database, "process_id", lambda: -1)
        childs = execute_alone(sqlalchemy.text("SELECT pg_backend_pid()"), {})

    assert parents != childs
