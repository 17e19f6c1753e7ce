"""Instructions per request, counted by callgrind: a repeatable figure for comparing changes.

bench/run.py measures CPU time from outside, as users would, but this machine's runs of
the same code vary by about 20%: too much to see a change worth 3%. Here each target
(the floor's Flask app and the gateway's, production settings, gevent-patched, metrics
in multiprocess mode) serves ``--requests`` requests in one process, called as a WSGI
app, in front of the fake upstream, and callgrind counts the user-space instructions of
those requests alone (the start-up and a warm-up are not counted). The same code counts
the same within a fraction of a percent, whatever else the machine does. What it leaves
out: the kernel's work (sockets, SQLite's file writes and locks: a third of SQLite's own
cost), gunicorn's, and time spent waiting, which bench/run.py's CPU times include. The
speed targets are in these counts (bench/RESULTS.md): at most 1.3x the floor on SQLite
and 1.6x on PostgreSQL (the sum with ``--postgresql``), whole answers and streams;
bench/run.py's ratios of the same interleaved run remain the throughput targets.

    .venv/bin/python bench/instructions.py [--stream] [--database-url URL | --postgresql]
        [--key KEY] [--requests 200]
        [--api responses|responses-native|messages|messages-native|gemini|embeddings]

``--postgresql`` serves the gateway on a private PostgreSQL server started for the run
under callgrind too (bench/counted_postgres.py), and adds, per gateway target, the
instructions of the backends of its connections (``:db``) and the request's total
(``:sum``, with its ratio to the floor, which has no database): on PostgreSQL part of a
request's work is the server's, and the speed targets are about the sum.

``--api responses`` also counts the gateway answering the same request through the
Responses API (POST /v1/responses, stored as by default), translated to the upstream's
chat completions; ``--api responses-native`` the same passed through to an upstream
that serves the Responses API itself (the fake upstream's ``bench-native``);
``--api messages`` through
Anthropic's Messages door (the same prompt, max_tokens and answer from the fake
upstream, translated both ways), ``--api messages-native`` the same passed through to an
upstream that serves the Messages API itself (the fake upstream's ``bench-claude``),
``--api gemini`` through Google's Gemini door (POST
/v1beta/models/bench-fast:generateContent, or :streamGenerateContent?alt=sse), each
beside its chat completion, with their ratio. ``--api embeddings`` counts an
embeddings request of 16 inputs (asking for base64, as the openai SDK does) to the fake
upstream's ``bench-embed`` (16 vectors of 1536 numbers), beside the chat completion.
``--key`` calls with a key of the database's own (bench/history.py prints its long
account's, on tables it filled) instead of a new account's.

valgrind is a Debian package (``apt-get install valgrind``); counting takes about a
minute per target.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.counted_postgres import DatabaseWork, Marks, counted_postgres  # noqa: E402
from bench.run import (  # noqa: E402
    PROMPT,
    Scenario,
    base_env,
    bench_catalog,
    free_port,
    funded_key,
    gateway_env,
    running,
    upstream_command,
)

WARM_UP = 50
TARGETS = ("floor", "gateway")
# The other doors the same request may be counted through, beside its chat completion.
DOORS = {
    "responses": "/v1/responses",
    "responses-native": "/v1/responses",
    "messages": "/v1/messages",
    "messages-native": "/v1/messages",
    "gemini": "/v1beta/models/bench-fast:generateContent",
    "embeddings": "/v1/embeddings",
}
PATHS = {"floor": "/v1/chat/completions", "gateway": "/v1/chat/completions", **DOORS}


def main(argv: list[str] | None = None) -> None:
    """Count each target's instructions per request under callgrind; print them."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        port = free_port()
        if args.postgresql:
            args.database_url, args.counts = stack.enter_context(counted_postgres(free_port()))
        upstream_log = Path(scratch) / "upstream.log"
        with running(upstream_command(port), dict(os.environ), port, upstream_log):
            counts = {
                target: count(target, args, port, Path(scratch)) for target in targets_of(args)
            }
            database = {target: database_work(args, target) for target in counts}
    for line in report(args, counts, database):
        print(line)


def report(
    args: argparse.Namespace, counts: dict[str, float], database: dict[str, DatabaseWork | None]
) -> list[str]:
    """Return the lines that say each target's instructions per request and their ratios."""
    kind = "stream (20 chunks)" if args.stream else "whole answer"
    url = args.database_url or ""
    name = "PostgreSQL" if url.startswith("postgres") else "SQLite"
    if args.postgresql:
        name += " (a private server under callgrind, its backends counted)"
    lines = [f"{kind}, gateway on {name}, {args.requests} requests counted per target"]
    for target, instructions in counts.items():
        line = f"{target:13} {instructions / 1e6:6.2f}M instructions per request  "
        line += f"{instructions / counts['floor']:.2f}x"
        if target in DOORS:
            line += f"  ({instructions / counts['gateway']:.3f}x the chat completion)"
        lines.append(line)
        work = database[target]
        if work is not None:
            lines += database_lines(target, instructions, work, args.requests, counts["floor"])
    return lines


def database_lines(
    target: str, instructions: float, work: DatabaseWork, requests: int, floor: float
) -> list[str]:
    """Return the server's lines for one target: its backends', and the request's total."""
    backends = work.backends / requests
    total = instructions + backends
    return [
        f"{target + ':db':13} {backends / 1e6:6.2f}M instructions per request in PostgreSQL's "
        f"backends of its {work.connections} connections "
        f"(background processes {work.background / requests / 1e6:.3f}M, not added)",
        f"{target + ':sum':13} {total / 1e6:6.2f}M instructions per request  {total / floor:.2f}x",
    ]


def database_work(args: argparse.Namespace, target: str) -> DatabaseWork | None:
    """Return what the counted server did for ``target``'s requests; None when not counted."""
    if not args.counts or target == "floor":
        return None
    return DatabaseWork(**json.loads((Path(args.counts) / f"work.{target}.json").read_text()))


def targets_of(args: argparse.Namespace) -> tuple[str, ...]:
    """Return the targets counted: the floor, the gateway, and the door asked for."""
    return TARGETS + ((args.api,) if args.api in DOORS else ())


def count(target: str, args: argparse.Namespace, upstream_port: int, scratch: Path) -> float:
    """Run ``target`` under callgrind; return its instructions per counted request."""
    output = scratch / f"callgrind.{target}.out"
    command = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={output}",
        sys.executable, __file__, "--serve", target, "--upstream-port", str(upstream_port),
        "--requests", str(args.requests),
        *(["--stream"] if args.stream else []),
        *(["--database-url", args.database_url] if args.database_url else []),
        *(["--key", args.key] if args.key else []),
        *(["--counts", str(args.counts)] if args.counts and target != "floor" else []),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{target} under callgrind: {done.stderr[-2000:]}")
    totals = next(line for line in output.read_text().splitlines() if line.startswith("totals:"))
    return int(totals.split()[1]) / args.requests


def serve(args: argparse.Namespace) -> None:
    """In the process callgrind runs: serve the requests, counting only the measured ones."""
    from gevent import monkey

    monkey.patch_all()
    scratch = Path(tempfile.mkdtemp())
    os.environ["BENCH_UPSTREAM_URL"] = f"http://127.0.0.1:{args.upstream_port}/v1/chat/completions"
    key = None
    if args.serve == "floor":
        from bench.floor_app import app
    else:
        key = configure_gateway(scratch, args.upstream_port, args.database_url, args.key)
        from wsgi import app
    body = request_body(args.serve, args.stream)
    path, query = path_of(args.serve, args.stream)
    for _ in range(WARM_UP):
        status = call(app, body, key, path, query)
        if not status.startswith("200"):
            raise RuntimeError(f"{args.serve} answered {status}")

    def counted() -> None:
        # The log and the metrics files stay open: counting starts and stops from outside.
        subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], capture_output=True)
        for _ in range(args.requests):
            call(app, body, key, path, query)
        subprocess.run(["callgrind_control", "--instr=off", str(os.getpid())], capture_output=True)

    if not args.counts:
        counted()
        return
    work = Marks(args.database_url, Path(args.counts)).counted(counted)
    (Path(args.counts) / f"work.{args.serve}.json").write_text(json.dumps(asdict(work)))


def path_of(target: str, stream: bool) -> tuple[str, str]:
    """Return the path and query string ``target`` is sent to (Gemini's stream has its own)."""
    if target == "gemini" and stream:
        return "/v1beta/models/bench-fast:streamGenerateContent", "alt=sse"
    return PATHS[target], ""


def request_body(target: str, stream: bool) -> bytes:
    """Return the body ``target`` is sent: the chat completion, or its twin at another door."""
    chat = Scenario("counted", "bench-fast", stream, 1).body()
    if target == "embeddings":
        inputs = [f"{PROMPT[0]['content']} ({index})" for index in range(16)]
        body = {"model": "bench-embed", "input": inputs, "encoding_format": "base64"}
        return json.dumps(body, separators=(",", ":")).encode()
    if target in ("responses", "responses-native"):
        model = "bench-native" if target == "responses-native" else "bench-fast"
        streamed = ',"stream":true' if stream else ""
        return (
            f'{{"model":"{model}","input":"{PROMPT[0]["content"]}",'
            f'"max_output_tokens":64{streamed}}}'
        ).encode()
    if target in ("messages", "messages-native"):
        fields = json.loads(chat)
        model = "bench-claude" if target == "messages-native" else fields["model"]
        body = {"model": model, "max_tokens": fields["max_tokens"], "messages": PROMPT}
        if stream:
            body["stream"] = True
        return json.dumps(body, separators=(",", ":")).encode()
    if target == "gemini":
        fields = json.loads(chat)
        body = {
            "contents": [{"role": "user", "parts": [{"text": PROMPT[0]["content"]}]}],
            "generationConfig": {"maxOutputTokens": fields["max_tokens"]},
        }
        return json.dumps(body, separators=(",", ":")).encode()
    return chat


def configure_gateway(
    scratch: Path, upstream_port: int, database_url: str | None, key: str | None = None
) -> str:
    """Set this process's environment for the gateway app; return a funded key.

    Production settings, metrics in multiprocess mode, in front of the fake upstream, on
    ``database_url`` or a SQLite file in ``scratch``; ``key``, one of the database's, or
    a new account's. The app is to be imported after.
    """
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(scratch)
    database = database_url or f"sqlite:///{scratch / 'gateway.sqlite3'}"
    env = {**base_env(0, 1, 100), **gateway_env(database, bench_catalog(scratch, upstream_port))}
    key = key or funded_key(env)
    os.environ.update(env)
    return key


def call(
    app: object, body: bytes, key: str | None, path: str = PATHS["gateway"], query: str = ""
) -> str:
    """Serve one request as gunicorn would hand it over; read the whole body; return the status."""
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": path, "QUERY_STRING": query,
        "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "127.0.0.1:8000",
        "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http",
        "wsgi.multithread": False, "wsgi.multiprocess": True, "wsgi.run_once": False,
    }  # fmt: skip
    if key:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    statuses: list[str] = []
    answer = app(environ, lambda status, headers, exc_info=None: statuses.append(status))
    try:
        for _ in answer:
            pass
    finally:
        getattr(answer, "close", lambda: None)()
    return statuses[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", action="store_true", help="count streamed requests")
    database = parser.add_mutually_exclusive_group()
    database.add_argument("--database-url", help="PostgreSQL URL for the gateway (else SQLite)")
    database.add_argument(
        "--postgresql",
        action="store_true",
        help="serve on a private PostgreSQL server under callgrind, its backends counted too",
    )
    parser.add_argument("--requests", type=int, default=200, help="counted per target")
    parser.add_argument(
        "--api",
        choices=("chat", *DOORS),
        default="chat",
        help="also count the same request through the Responses API or the Messages door",
    )
    parser.add_argument("--key", help="an API key of the database's, funded (else a new one)")
    parser.add_argument("--serve", choices=(*TARGETS, *DOORS), help=argparse.SUPPRESS)
    parser.add_argument("--upstream-port", type=int, help=argparse.SUPPRESS)
    # Where the counted server writes its counts, for the process it serves in.
    parser.add_argument("--counts", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.postgresql and args.key:
        parser.error("--key calls a database of its own: not the private server of --postgresql")
    return args


if __name__ == "__main__":
    arguments = parse_args(None)
    if arguments.serve:
        serve(arguments)
    else:
        main()
