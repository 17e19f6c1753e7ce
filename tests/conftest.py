"""Fixtures: the app on each test database, a real gunicorn server, accounts and keys.

Every test that touches the database runs once per database: SQLite always, and the
PostgreSQL of TEST_DATABASE_URL when it is set. Each run gets a fresh, migrated database;
tests stay independent by creating their own accounts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from email import message_from_bytes
from pathlib import Path

import pytest
import requests
import sqlalchemy
from flask import Flask
from flask_migrate import upgrade

from app import create_app
from app.extensions import db
from config.settings import normalize_database_url
from tests.factories import AccountFactory

ROOT = Path(__file__).resolve().parent.parent
TEST_CATALOG = str(ROOT / "tests" / "fixtures" / "models.toml")
DATABASES = ["sqlite"] + (["postgresql"] if os.environ.get("TEST_DATABASE_URL") else [])


def pytest_addoption(parser: pytest.Parser) -> None:
    """Replay options of the money-path simulation (tests/simulation)."""
    group = parser.getgroup("simulation", "money-path simulation")
    group.addoption("--seed", type=int, default=None, help="run the simulation with this seed only")
    group.addoption("--steps", type=int, default=None, help="steps of each simulation run")


@pytest.fixture(scope="session", params=DATABASES)
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A fresh database URL for this session, per backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'test.sqlite3'}"
        return
    yield from _fresh_postgres_database(os.environ["TEST_DATABASE_URL"])


def _fresh_postgres_database(server_url: str) -> Iterator[str]:
    url = sqlalchemy.engine.make_url(normalize_database_url(server_url))
    name = f"gateway_test_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def app(database_url: str):
    """The application on the session's database, migrated to the latest revision."""
    app = create_app(
        "testing",
        {"SQLALCHEMY_DATABASE_URI": database_url, "MODEL_CATALOG": TEST_CATALOG},
    )
    with app.app_context():
        upgrade()
    yield app


@pytest.fixture
def empty_database_url(database_url: str, tmp_path) -> Iterator[str]:
    """A database of its own, on the session's backend, that no migration has run on."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'migrated.sqlite3'}"
        return
    yield from _fresh_postgres_database(os.environ["TEST_DATABASE_URL"])


@pytest.fixture
def disposable_app(database_url: str, tmp_path) -> Iterator[Flask]:
    """The app on a database of its own, for a ledger broken on purpose, or pruned.

    Pruning's marks are the whole database's.
    The session's database must stay consistent for the other tests' audits.
    """
    if database_url.startswith("sqlite"):
        yield _migrated_app(f"sqlite:///{tmp_path / 'disposable.sqlite3'}")
        return
    for url in _fresh_postgres_database(os.environ["TEST_DATABASE_URL"]):
        app = _migrated_app(url)
        yield app
        with app.app_context():
            # Its connections must be closed before the database can be dropped.
            db.engine.dispose()


def _migrated_app(url: str) -> Flask:
    app = create_app("testing", {"SQLALCHEMY_DATABASE_URI": url, "MODEL_CATALOG": TEST_CATALOG})
    with app.app_context():
        upgrade()
    return app


@pytest.fixture
def app_context(app):
    """An application context, for calling domain functions directly."""
    with app.app_context():
        yield app


@pytest.fixture
def client(app):
    """Werkzeug's test client, for in-process HTTP."""
    return app.test_client()


@pytest.fixture
def runner(app):
    """Click's runner for the operator commands."""
    return app.test_cli_runner()


@dataclass(frozen=True)
class FundedKey:
    """An account with credits and one active key."""

    account_id: int
    email: str
    key: str
    key_id: int


@pytest.fixture
def make_funded_key(app):
    """Create an account with ``credits`` USD and a key: ``make_funded_key(Decimal('5'))``."""

    def make(credits: Decimal = Decimal("10")) -> FundedKey:
        with app.app_context():
            account, issued = AccountFactory.with_key(credits=credits)
            return FundedKey(account.id, account.email, issued.value, issued.id)

    return make


@pytest.fixture
def funded_key(make_funded_key) -> FundedKey:
    """An account with $10 of credits and a key."""
    return make_funded_key()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class LiveServer:
    """A gunicorn server of the app: its base URL and process."""

    url: str
    process: subprocess.Popen


@contextmanager
def running_server(
    database_url: str,
    log_dir: Path,
    *,
    catalog: str = TEST_CATALOG,
    port: int | None = None,
    **env: str,
) -> Iterator[LiveServer]:
    """Run gunicorn as the Procfile does, on ``port`` or a free one; ``env`` adds variables."""
    port = port or _free_port()
    environment = {
        **os.environ,
        "APP_ENV": "testing",
        "DATABASE_URL": database_url,
        "MODEL_CATALOG": catalog,
        "PORT": str(port),
        "WEB_CONCURRENCY": "1",
        **env,
    }
    with open(log_dir / f"gunicorn-{port}.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "wsgi:app"],
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_until_up(url, process)
            yield LiveServer(url=url, process=process)
        finally:
            # SIGINT is gunicorn's quick shutdown: idle keep-alive connections need no grace.
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)


@pytest.fixture(scope="session")
def live_server(
    app, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """The real service, as the Procfile runs it: gunicorn, gevent workers, real HTTP."""
    with running_server(database_url, tmp_path_factory.mktemp("server")) as server:
        yield server


def _wait_until_up(url: str, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with status {process.returncode}")
        try:
            if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):
            # A worker still loading the app under load answers late, not never.
            time.sleep(0.1)
    raise RuntimeError("gunicorn did not answer /healthz in time")


@contextmanager
def running_smtp_server() -> Iterator[tuple[list, str]]:
    """A real SMTP server in this process (aiosmtpd): the messages it receives, its URL."""
    from aiosmtpd.controller import Controller

    received: list = []

    class Inbox:
        async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802
            received.append(message_from_bytes(envelope.content))
            return "250 Message accepted for delivery"

    port = _free_port()
    controller = Controller(Inbox(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield received, f"smtp://127.0.0.1:{port}"
    finally:
        controller.stop()


@pytest.fixture
def smtp_server() -> Iterator[tuple[list, str]]:
    """A real SMTP server in this process (aiosmtpd): the messages it receives, its URL."""
    with running_smtp_server() as server:
        yield server
