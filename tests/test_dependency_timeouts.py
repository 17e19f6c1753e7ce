"""A database host that never answers fails the request in seconds, not the OS's minutes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from app import create_app
from config.settings import database_engine_options
from tests.conftest import ROOT

TEST_CATALOG_OVERRIDES = {"MODEL_CATALOG": "tests/fixtures/models.toml"}


def test_postgresql_connections_get_a_connect_timeout_and_sqlite_none():
    postgres = database_engine_options(
        {
            "SQLALCHEMY_DATABASE_URI": "postgresql+psycopg://db.internal/gateway",
            "SQLALCHEMY_ENGINE_OPTIONS": {"pool_pre_ping": True},
            "DATABASE_CONNECT_TIMEOUT_SECONDS": 3,
            "DATABASE_POOL_SIZE": 5,
        }
    )["SQLALCHEMY_ENGINE_OPTIONS"]
    sqlite = database_engine_options(
        {
            "SQLALCHEMY_DATABASE_URI": "sqlite:///x.sqlite3",
            "DATABASE_CONNECT_TIMEOUT_SECONDS": 3,
            "DATABASE_POOL_SIZE": 5,
        }
    )["SQLALCHEMY_ENGINE_OPTIONS"]
    assert postgres == {
        "pool_pre_ping": True,
        "pool_size": 5,
        "max_overflow": 0,
        "connect_args": {"connect_timeout": 3},
    }
    assert "connect_args" not in sqlite


def test_readyz_answers_503_when_postgresql_never_answers(tmp_path):
    # A listening socket that never accepts: the TCP handshake completes in the backlog,
    # and the server's greeting never comes, as with a host behind a dropping firewall.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    app = create_app(
        "testing",
        {
            "SQLALCHEMY_DATABASE_URI": f"postgresql+psycopg://postgres@127.0.0.1:{port}/gateway",
            "DATABASE_CONNECT_TIMEOUT_SECONDS": 2,
            **TEST_CATALOG_OVERRIDES,
        },
    )
    answers = []
    probe = threading.Thread(
        target=lambda: answers.append(app.test_client().get("/readyz")), daemon=True
    )
    try:
        probe.start()
        # Far beyond the timeout; without one the probe would wait for the OS, minutes.
        probe.join(timeout=60)
    finally:
        silent.close()

    assert answers, "readyz was still waiting for the database"
    assert answers[0].status_code == 503
    assert answers[0].json["error"]["code"] == "database_unavailable"


# A worker as gunicorn's configuration makes it: gevent patches the process before
# psycopg is imported, and another greenlet counts the turns it gets meanwhile.
IN_A_WORKER = """
from gevent import monkey; monkey.patch_all()
import socket, sys, gevent, psycopg
turns = []

def count_turns():
    while True:
        turns.append(1)
        gevent.sleep(0.02)

gevent.spawn(count_turns)
"""
GREEN_CONNECT = (
    IN_A_WORKER
    + """
silent = socket.socket()
silent.bind(("127.0.0.1", 0))
silent.listen(8)
try:
    with gevent.Timeout(30):
        psycopg.connect(
            host="127.0.0.1", port=silent.getsockname()[1], user="postgres", connect_timeout=1
        )
except BaseException as error:
    print(isinstance(error, psycopg.OperationalError), len(turns) > 10)
"""
)
GREEN_QUERY = (
    IN_A_WORKER
    + """
with psycopg.connect(sys.argv[1]) as connection:
    before = len(turns)
    connection.execute("SELECT pg_sleep(0.5)")
    print(len(turns) - before > 10)
"""
)


def run_in_a_worker(script: str, *arguments: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script, *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip() or done.stderr


def test_a_gevent_worker_honours_the_connect_timeout_and_serves_others_meanwhile():
    # A gevent.Timeout here would mean nobody enforced connect_timeout; no turns, that
    # the whole worker waited for the silent host.
    assert run_in_a_worker(GREEN_CONNECT) == "True True"


@pytest.mark.skipif(not os.environ.get("TEST_DATABASE_URL"), reason="needs a PostgreSQL server")
def test_a_slow_statement_lets_the_workers_other_requests_run():
    assert run_in_a_worker(GREEN_QUERY, os.environ["TEST_DATABASE_URL"]) == "True"
