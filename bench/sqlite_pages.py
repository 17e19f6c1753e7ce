"""Which pages a billed request writes to SQLite, counted by table and index.

A SQLite commit appends every page its transaction changed, whole, to the WAL: the pages
a request changes are most of SQLite's cost (bench/sqlite_writes.py times it). This
counts them on the gateway as users run it (gunicorn, one gevent worker, production
settings, the fake upstream): ``--warm-up`` requests first, so that the tables and
indexes have grown and split as they do in service; then the WAL is checkpointed and
emptied, ``--requests`` requests are served, and every frame the WAL holds is read and
named by the table or index its page belongs to (SQLite's ``dbstat`` table). The
counts do not depend on the machine's speed, and move by about 1% between runs (where
an index's page splits fall among the counted requests: most ids are random): they
judge a change to the schema, an index or a statement's writes before it is timed.
The counted requests must fit in the WAL before its checkpoint (about 190 of them).

    .venv/bin/python bench/sqlite_pages.py [--stream] [--warm-up 2000] [--requests 150]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import struct
import sys
import tempfile
from collections import Counter
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.database.sqlite import sqlite_checkpoint_pages  # noqa: E402
from bench.load import send_requests  # noqa: E402
from bench.run import (  # noqa: E402
    Gateway,
    Scenario,
    Target,
    bench_catalog,
    free_port,
    running,
    start_gateway,
    upstream_command,
)

# The WAL's header and each frame's begin with these fields; both end with two checksums.
WAL_HEADER = struct.Struct(">IIIIII")  # magic, version, page size, checkpoint, salt-1, salt-2
WAL_HEADER_SIZE = 32
FRAME_HEADER = struct.Struct(">IIII")  # page, database pages after a commit (else 0), salts
FRAME_HEADER_SIZE = 24


@dataclass(frozen=True)
class Frame:
    """One page written to the WAL, and whether its transaction's commit ends with it."""

    page: int
    commits: bool


def wal_frames(wal: bytes) -> list[Frame]:
    """Return the frames of the WAL whose contents are ``wal``, oldest first.

    A frame counts while its salts are the header's: past them lie frames a restarted
    WAL has not overwritten yet, left from before its last checkpoint.
    """
    if len(wal) < WAL_HEADER_SIZE:
        return []
    _, _, page_size, _, salt_1, salt_2 = WAL_HEADER.unpack_from(wal)
    frames, offset = [], WAL_HEADER_SIZE
    while offset + FRAME_HEADER_SIZE + page_size <= len(wal):
        page, pages_after_commit, frame_salt_1, frame_salt_2 = FRAME_HEADER.unpack_from(wal, offset)
        if (frame_salt_1, frame_salt_2) != (salt_1, salt_2):
            break
        frames.append(Frame(page, pages_after_commit != 0))
        offset += FRAME_HEADER_SIZE + page_size
    return frames


def page_owners(connection: sqlite3.Connection) -> dict[int, str]:
    """Return the name of the table or index each page of the database belongs to.

    Page 1 belongs to ``sqlite_schema``: it also holds the file's header, which a commit
    rewrites when the file grows.
    """
    return dict(connection.execute("SELECT pageno, name FROM dbstat"))


def pages_by_owner(frames: list[Frame], owners: dict[int, str]) -> Counter[str]:
    """Count ``frames`` by the table or index of their page (a page freed since: ``free``)."""
    return Counter(owners.get(frame.page, "free") for frame in frames)


def empty_wal(path: Path) -> None:
    """Checkpoint the WAL of the database at ``path`` into it and truncate the WAL."""
    with closing(sqlite3.connect(path)) as connection:
        busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        raise RuntimeError("the gateway held the database: the WAL could not be emptied")


def serve_and_count(args: argparse.Namespace, scratch: Path) -> tuple[list[Frame], Counter[str]]:
    """Serve the warm-up and the counted requests; return the counted ones' frames, named."""
    database = scratch / "gateway.sqlite3"
    scenario = Scenario("counted", "bench-fast", args.stream, 1)
    with ExitStack() as stack:
        port = free_port()
        upstream = upstream_command(port)
        stack.enter_context(running(upstream, dict(os.environ), port, scratch / "upstream.log"))
        gateway = Gateway("gateway", f"sqlite:///{database}", bench_catalog(scratch, port), 1)
        target = start_gateway(stack, scratch, gateway)
        serve(target, scenario, args.warm_up)
        empty_wal(database)
        serve(target, scenario, args.requests)
        frames = wal_frames(Path(f"{database}-wal").read_bytes())
        with closing(sqlite3.connect(database)) as connection:
            page_size = connection.execute("PRAGMA page_size").fetchone()[0]
            owners = page_owners(connection)
    if len(frames) >= sqlite_checkpoint_pages(page_size):
        # The WAL may have been checkpointed and restarted meanwhile: frames were lost.
        raise RuntimeError("the counted requests filled the WAL: count fewer of them")
    if not frames:
        raise RuntimeError("the counted requests left no frame in the WAL")
    return frames, pages_by_owner(frames, owners)


def serve(target: Target, scenario: Scenario, count: int) -> None:
    """Have ``target`` serve ``count`` requests of ``scenario``, one at a time, all answered."""
    timings = asyncio.run(
        send_requests(
            target.port, scenario.body(), target.key, count=count,
            concurrency=1, streamed=scenario.streamed,
        )
    )  # fmt: skip
    if timings.errors:
        raise RuntimeError(f"a request failed: {timings.errors[0]}")


def main(argv: list[str] | None = None) -> None:
    """Print the pages a request writes: in all, by commit, and by table or index."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        frames, owners = serve_and_count(args, Path(scratch))
    count = args.requests
    kind = "stream (20 chunks)" if args.stream else "whole answer"
    commits = sum(frame.commits for frame in frames)
    print(
        f"{kind}: {count} requests counted after {args.warm_up:,}: "
        f"{len(frames) / count:.1f} pages written a request, in {commits / count:.1f} commits"
    )
    print("| table or index | pages a request |\n|---|---:|")
    for name, pages in owners.most_common():
        print(f"| {name} | {pages / count:.2f} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Read the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", action="store_true", help="count 20-chunk streams")
    parser.add_argument("--warm-up", type=int, default=2000, help="requests served uncounted")
    parser.add_argument("--requests", type=int, default=150, help="requests counted")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
