"""A database host that never answers fails the request in seconds, not the OS's minutes."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

from app import create_app
from config.settings import database_engine_options
from tests.conftest import ROOT

TEST_CATALOG_OVERRIDES = {"MODEL_CATALOG": "tests/fixtures/models.toml"}


def test_postgresql_connections_get_a_connect_timeout_and_sqlite_none():
    postgres = database_engine_options(
        {
            "SQLALCHEMY_DATABASE_URI": "postgresql+psycopg2://db.internal/gateway",
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
            "SQLALCHEMY_DATABASE_URI": f"postgresql+psycopg2://postgres@127.0.0.1:{port}/gateway",
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


GREEN_CONNECT = """
from gevent import monkey; monkey.patch_all()
import socket, gevent, psycopg2
from psycopg2.extensions import set_wait_callback
from app.database import wait_cooperatively

set_wait_callback(wait_cooperatively)
silent = socket.socket()
silent.bind(("127.0.0.1", 0))
silent.listen(8)
try:
    with gevent.Timeout(30):
        psycopg2.connect(
            host="127.0.0.1", port=silent.getsockname()[1], user="postgres", connect_timeout=1
        )
except BaseException as error:
    print(type(error).__name__)
"""


def test_a_gevent_worker_honours_the_connect_timeout():
    # The workers' wait callback makes psycopg2 connect asynchronously, where libpq
    # itself no longer enforces connect_timeout: a gevent.Timeout here means nobody did.
    done = subprocess.run(
        [sys.executable, "-c", GREEN_CONNECT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "OperationalError", done.stderr
