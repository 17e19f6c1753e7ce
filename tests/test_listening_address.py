"""Where gunicorn listens: loopback in development (it prints a demo key), HOST when set.

The server is started as ``make run`` starts it (config/gunicorn.conf.py), and its
"Listening at" line and a connection from this machine's other address say where it is.
"""

from __future__ import annotations

import socket

import pytest

from tests.conftest import running_server

# Development's defaults, set here so that the test writes nothing in the instance folder.
DEVELOPMENT = {"APP_ENV": "development", "SECRET_KEY": "listening-address-test"}


def other_address() -> str | None:
    """Return the machine's address on its default route, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def reachable(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
    except OSError:
        return False
    return True


def listening_line(log_dir, port: int) -> str:
    log = (log_dir / f"gunicorn-{port}.log").read_text()
    return next(line for line in log.splitlines() if "Listening at" in line)


def test_development_listens_on_loopback_only(app, database_url, tmp_path):
    with running_server(database_url, tmp_path, **DEVELOPMENT) as server:
        port = int(server.url.rsplit(":", 1)[1])
        assert f"Listening at: http://127.0.0.1:{port}" in listening_line(tmp_path, port)
        if (address := other_address()) is not None:
            assert not reachable(address, port)


@pytest.mark.parametrize("env", [{**DEVELOPMENT, "HOST": "0.0.0.0"}, {"APP_ENV": "testing"}])
def test_host_or_another_environment_listens_on_every_interface(app, database_url, tmp_path, env):
    with running_server(database_url, tmp_path, **env) as server:
        port = int(server.url.rsplit(":", 1)[1])
        assert f"Listening at: http://0.0.0.0:{port}" in listening_line(tmp_path, port)
        if (address := other_address()) is not None:
            assert reachable(address, port)
