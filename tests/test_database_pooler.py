"""Behind a pooler in transaction mode (PgBouncer): nothing is prepared, every request billed.

Such a pooler hands each transaction to whichever server session is free, so a
statement prepared in one could be executed by its name in another, where the name may
stand for another statement. The gateway finds the pooler from each new connection's
first round trip (the server process answering is not the one the connection was told
of) and prepares nothing from then on.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from decimal import Decimal

import pytest
import sqlalchemy
from sqlalchemy import func, select

from app import create_app
from app.credits.models import LedgerEntry
from app.database import PREPARED_STATEMENTS_LOST, execute_alone
from app.extensions import db
from tests.conftest import TEST_CATALOG

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
HELLO = {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def pooled_url(database_url: str) -> Iterator[str]:
    """A PgBouncer in transaction mode in front of the test database; its URL."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a pooler stands in front of a database server")
    if not os.path.exists(PGBOUNCER):
        pytest.skip("the pgbouncer Debian package is not installed")
    server = sqlalchemy.make_url(database_url)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="pgbouncer-")
    # PgBouncer refuses to run as root: as root, it is started as postgres.
    user = ["-u", "postgres"] if os.geteuid() == 0 else []
    if user:
        os.chown(folder, pwd.getpwnam("postgres").pw_uid, -1)
    with open(os.path.join(folder, "users.txt"), "w") as users:
        users.write(f'"{server.username}" ""\n')
    with open(os.path.join(folder, "pgbouncer.ini"), "w") as config:
        config.write(
            "[databases]\n"
            f"{server.database} = host={server.host} port={server.port or 5432}"
            f" dbname={server.database}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
            f"unix_socket_dir =\nauth_type = trust\nauth_file = {folder}/users.txt\n"
            "pool_mode = transaction\ndefault_pool_size = 4\n"
            f"pidfile = {folder}/pgbouncer.pid\nlogfile = {folder}/pgbouncer.log\n"
        )
    os.chmod(folder, 0o755)
    process = subprocess.Popen([PGBOUNCER, *user, os.path.join(folder, "pgbouncer.ini")])
    try:
        _wait_for(port)
        yield server.set(port=port).render_as_string(hide_password=False)
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for(port: int) -> None:
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("pgbouncer did not start")


def test_behind_a_pooler_nothing_is_prepared_and_every_request_is_billed(pooled_url, funded_key):
    app = create_app(
        "testing", {"SQLALCHEMY_DATABASE_URI": pooled_url, "MODEL_CATALOG": TEST_CATALOG}
    )
    client = app.test_client()
    headers = {"Authorization": f"Bearer {funded_key.key}"}

    answers = [client.post("/v1/chat/completions", json=HELLO, headers=headers) for _ in range(8)]

    assert [answer.status_code for answer in answers] == [200] * 8
    assert app.extensions[PREPARED_STATEMENTS_LOST]
    with app.app_context():
        prepared = execute_alone(sqlalchemy.text("SELECT count(*) FROM pg_prepared_statements"), {})
        charges = db.session.scalar(
            select(func.count()).where(
                LedgerEntry.account_id == funded_key.account_id, LedgerEntry.kind == "charge"
            )
        )
        balance_spent = db.session.scalar(
            select(func.sum(LedgerEntry.amount)).where(
                LedgerEntry.account_id == funded_key.account_id
            )
        )
    assert prepared[0][0] == 0
    assert charges == 8 and balance_spent < Decimal("10")
