"""CPU per request of the gateway against the bare Flask/gevent floor, as a ratio.

Each server runs as the Procfile runs it (gunicorn, one gevent worker); the worker's own
CPU time (utime + stime from /proc) is read before and after N requests sent by 8 client
threads, after a warm-up. The gateway serves dev-chat-mini from the built-in model with
auth, validation, a hold and settlement on every request.

    .venv/bin/python bench/cpu_per_request.py [--requests 1000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
BODY = {
    "model": "dev-chat-mini",
    "messages": [{"role": "user", "content": "hello"}],
    "max_tokens": 16,
    "seed": 1,
}


def worker_cpu_seconds(master_pid: int) -> float:
    """Return the CPU time used so far by the gunicorn master's only worker."""
    worker = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()[0]
    fields = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(app: str, env: dict[str, str], port: int) -> subprocess.Popen:
    """Start gunicorn on ``app`` and wait until it answers."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", app,
         "--access-logfile", "/dev/null", "--workers", "1", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(100):
        try:
            requests.get(f"http://127.0.0.1:{port}/", timeout=1)
            return process
        except requests.ConnectionError:
            time.sleep(0.1)
    raise RuntimeError(f"{app} did not start")


def measure(process: subprocess.Popen, url: str, key: str, count: int) -> float:
    """Return the worker's milliseconds of CPU per request over ``count`` requests."""
    headers = {"Authorization": f"Bearer {key}"}

    def send(_: int) -> None:
        response = requests.post(url, json=BODY, headers=headers, timeout=30)
        response.raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, range(100)))
        before = worker_cpu_seconds(process.pid)
        list(pool.map(send, range(count)))
        after = worker_cpu_seconds(process.pid)
    return (after - before) * 1000 / count


def gateway_key(env: dict[str, str]) -> str:
    """Migrate the database and issue a funded key."""
    flask = [sys.executable, "-m", "flask"]
    email = f"bench-{time.time_ns()}@example.com"
    subprocess.run([*flask, "db", "upgrade"], cwd=ROOT, env=env, check=True, capture_output=True)
    subprocess.run(
        [*flask, "accounts", "create", email, "--credits", "1000"],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip
    issued = subprocess.run(
        [*flask, "keys", "create", email, "--name", "bench"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return issued.stdout.strip().splitlines()[-1]


def run(label: str, app: str, env: dict[str, str], key: str, count: int, port: int) -> float:
    """Serve ``app``, measure it, stop it; print and return its CPU per request."""
    process = serve(app, env, port)
    try:
        cost = measure(process, f"http://127.0.0.1:{port}/v1/chat/completions", key, count)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait()
    print(f"{label:<10} {cost:6.2f} ms CPU per request")
    return cost


def main() -> None:
    """Measure the floor and the gateway, and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-")
    env = {
        **os.environ,
        "APP_ENV": "testing",
        "FLASK_APP": "wsgi",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": args.database_url or f"sqlite:///{scratch}/bench.sqlite3",
        # Counted like any request, but high enough never to refuse the benchmark.
        "RATE_LIMIT": "1000000 per minute",
    }
    floor = run("floor", "bench.floor_app:app", env, "", args.requests, 8871)
    gateway = run("gateway", "wsgi:app", env, gateway_key(env), args.requests, 8872)
    print(f"gateway / floor = {gateway / floor:.2f}")


if __name__ == "__main__":
    main()
