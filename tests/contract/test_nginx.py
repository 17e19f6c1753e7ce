"""deploy/nginx.conf in front of gunicorn: streams pass as written, callers' addresses hold.

nginx runs as a foreground subprocess on free ports, its config rendered from the
example into a temporary folder (pid, logs and temp files there too). It connects to
gunicorn from 127.0.0.3, the one address gunicorn trusts X-Forwarded-For from.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from tests.conftest import ROOT, _free_port, running_server

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PROXY_ADDRESS = "127.0.0.3"
SPOOFED = "198.51.100.7"
TOKEN_DELAY_SECONDS = 0.05  # dev-slow's, in tests/fixtures/models.toml

pytestmark = pytest.mark.skipif(
    not os.path.exists(NGINX), reason="nginx is not installed (make test installs it)"
)


def render_config(folder: Path, *, listen: int, gunicorn: str) -> Path:
    """Write deploy/nginx.conf with this test's ports and paths; return its path."""
    text = (ROOT / "deploy" / "nginx.conf").read_text()
    replacements = {
        "server 127.0.0.1:8000;": f"server {gunicorn};",
        "listen 8080;": f"listen 127.0.0.1:{listen};",
        "http {": "http {\n"
        + "".join(
            f"    {directive};\n"
            for directive in (
                f"access_log {folder}/access.log",
                f"client_body_temp_path {folder}/body",
                f"proxy_temp_path {folder}/proxy",
                f"fastcgi_temp_path {folder}/fastcgi",
                f"uwsgi_temp_path {folder}/uwsgi",
                f"scgi_temp_path {folder}/scgi",
                f"proxy_bind {PROXY_ADDRESS}",
            )
        ),
    }
    for example, rendered in replacements.items():
        assert text.count(example) == 1, f"deploy/nginx.conf no longer has {example!r}"
        text = text.replace(example, rendered)
    main = [f"pid {folder}/nginx.pid;", f"error_log {folder}/error.log info;"]
    if os.geteuid() == 0:
        main.append("user root;")  # workers keep access to this root-owned temp folder
    path = folder / "nginx.conf"
    path.write_text("\n".join(main) + "\n" + text)
    return path


@contextmanager
def running_nginx(folder: Path, gunicorn_url: str) -> Iterator[str]:
    """Run nginx in the foreground in front of ``gunicorn_url``; yield its URL."""
    port = _free_port()
    config = render_config(folder, listen=port, gunicorn=urlsplit(gunicorn_url).netloc)
    process = subprocess.Popen(
        [NGINX, "-p", str(folder), "-c", str(config), "-e", str(folder / "error.log"),
         "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            assert process.poll() is None, (folder / "error.log").read_text()
            try:
                requests.get(f"{url}/healthz", timeout=1)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)
        yield url
    finally:
        process.send_signal(signal.SIGQUIT)
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def proxied(app, database_url, tmp_path_factory):
    """Nginx in front of gunicorn; yields (nginx URL, gunicorn URL, gunicorn's log)."""
    folder = tmp_path_factory.mktemp("nginx")
    with (
        running_server(
            database_url,
            folder,
            LOG_FORMAT="json",
            PROXY_HOPS="1",
            FORWARDED_ALLOW_IPS=PROXY_ADDRESS,
        ) as server,
        running_nginx(folder, server.url) as url,
    ):
        yield url, server.url, next(folder.glob("gunicorn-*.log"))


def access_line(log: Path, request_id: str) -> dict:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record["logger"] == "gateway.access" and record["request_id"] == request_id:
                return record
        time.sleep(0.05)
    raise AssertionError(f"no access line for {request_id}")


def test_a_stream_arrives_through_nginx_token_by_token(proxied, funded_key):
    url, _, _ = proxied
    words = " ".join(f"w{i}" for i in range(30))

    response = requests.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded_key.key}"},
        json={"model": "dev-slow", "messages": [{"role": "user", "content": words}],
              "stream": True},
        stream=True,
        timeout=60,
    )  # fmt: skip
    arrivals, pending = [], b""
    for piece in response.iter_content(chunk_size=None):
        pending += piece
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            arrivals.append((time.monotonic(), event))

    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert arrivals[-1][1] == b"data: [DONE]"
    tokens = [t for t, event in arrivals if b'"content"' in event]
    assert len(tokens) >= 30
    # Buffered, every event would arrive at once; relayed, they arrive as dev-slow
    # writes them, one per token delay. Half of that is a floor no slow machine breaks.
    assert tokens[-1] - tokens[0] >= (len(tokens) - 1) * TOKEN_DELAY_SECONDS / 2


def test_the_logged_address_is_the_callers_one_hop_back(proxied, funded_key):
    url, gunicorn_url, log = proxied
    headers = {"Authorization": f"Bearer {funded_key.key}", "X-Forwarded-For": SPOOFED}

    through_nginx = requests.get(f"{url}/v1/models", headers={**headers, "X-Request-Id": "via-1"})
    direct = requests.get(
        f"{gunicorn_url}/v1/models", headers={**headers, "X-Request-Id": "direct-1"}
    )

    assert through_nginx.status_code == direct.status_code == 200
    assert through_nginx.headers["X-Request-Id"] == "via-1"
    # nginx saw the caller at 127.0.0.1 and appended it after the spoofed address; one
    # trusted hop reads that last entry, not nginx's own 127.0.0.3, nor the spoof.
    assert access_line(log, "via-1")["client"] == "127.0.0.1"
    # Straight to gunicorn, from an address that is no trusted proxy: the header is ignored.
    assert access_line(log, "direct-1")["client"] == "127.0.0.1"


def test_nginx_gives_a_request_without_an_id_its_own(proxied):
    url, _, log = proxied

    response = requests.get(f"{url}/healthz")

    request_id = response.headers["X-Request-Id"]
    assert len(request_id) == 32 and access_line(log, request_id)["client"] == "127.0.0.1"
