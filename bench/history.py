"""History at scale: an account's usage read with a long history, beside one with 100.

Seeds one database through the product's own tables: three accounts, each with two keys,
one with ``--generations`` generations (default 2,000,000) over 90 days on three models,
one with 100 over the last day, and one with 10,000 over 90 days (a little more than a
megabyte of CSV), each generation charged in the ledger; then ``flask usage rebuild``
(``rebuild_rollups``) fills their rollups. PostgreSQL's rows are
written by INSERT ... SELECT over generate_series, SQLite's by executemany in batches.
Then the gateway serves the database (gunicorn, one gevent worker, production settings)
and every read of an account's history is timed from outside, the accounts
interleaved, ``--rounds`` times after a warm-up round: the usage page (as it opens,
filtered by model, by key, by dates, and its next page), the keys page, the balance
page, the CSV's first megabyte, GET /v1/key, GET /v1/credits and GET /v1/generations/{id}.
Each figure is the median of the rounds, with the long history's ratio to the short
one's, and to the 10,000's: a read whose output is bounded (the CSV's first megabyte)
does the same work for the long account as for that one, so what the long one adds over
it is what its history costs, where over the short one it also adds its 9,000 rows.
Last, the audit of the long account: --full, then since its checkpoint.

    .venv/bin/python bench/history.py [--database-url URL] [--generations N] [--rounds 7]

With ``--database-url`` (an empty PostgreSQL database) the database is left seeded, for
its owner to drop; SQLite's file is removed at the end unless ``--keep``. The hot path's
instructions with these tables: ``bench/instructions.py --database-url URL --key KEY``,
with the URL and the long account's key printed here.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import requests
from flask import Flask

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import base_env, bench_catalog, free_port, gateway_env, running  # noqa: E402

PASSWORD = "bench history password"
MODELS = ("bench-fast", "bench-slow", "bench-drip")
SPAN = timedelta(days=90)
SEED_BATCH = 20_000
CSV_BYTES = 1_000_000
# An account whose CSV is a little over CSV_BYTES: its first megabyte is as long as the
# long account's, so the difference between the two is what the long history costs.
MID_GENERATIONS = 10_000
# Prices of bench/models.toml's models, in money units per token: costs are exact.
PROMPT_UNITS, COMPLETION_UNITS = 5_000, 15_000


@dataclass
class Holder:
    """A seeded account: who signs in, its keys, its generations."""

    name: str
    email: str
    account_id: int = 0
    key: str = ""
    key_ids: tuple[int, int] = (0, 0)
    generations: int = 0
    a_generation: str = ""


def main(argv: list[str] | None = None) -> None:
    """Seed, serve, time every read for each account; print the table."""
    args = parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-history-"))
    database_url = args.database_url or f"sqlite:///{scratch / 'history.sqlite3'}"
    holders = [
        Holder("long", f"long-{time.time_ns()}@example.com", generations=args.generations),
        Holder("short", f"short-{time.time_ns()}@example.com", generations=100),
        Holder("mid", f"mid-{time.time_ns()}@example.com", generations=MID_GENERATIONS),
    ]
    app = seed(database_url, holders, scratch)
    print(f"database {database_url}; long account's key {holders[0].key}")
    catalog = bench_catalog(scratch, free_port())
    with serving(database_url, catalog, scratch) as url:
        sessions = {holder.name: signed_in(url, holder) for holder in holders}
        timings = time_reads(url, holders, sessions, args.rounds)
    print_table(timings)
    time_audits(app, holders[0])
    if not args.database_url and not args.keep:
        shutil.rmtree(scratch)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="an empty PostgreSQL database (else SQLite)")
    parser.add_argument("--generations", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep SQLite's seeded file")
    return parser.parse_args(argv)


def seed(database_url: str, holders: list[Holder], scratch: Path) -> Flask:
    """Migrate the database and give each holder its account, keys and history."""
    from flask_migrate import upgrade

    from app import create_app
    from config.settings import normalize_database_url

    catalog = bench_catalog(scratch, free_port())
    url = normalize_database_url(database_url)
    config = {"SQLALCHEMY_DATABASE_URI": url, "MODEL_CATALOG": str(catalog)}
    app = create_app("testing", config)
    with app.app_context():
        upgrade()
        for holder in holders:
            timed(f"seeded {holder.name}", lambda holder=holder: seed_holder(holder))
    return app


def timed(label: str, work: Callable[[], object]) -> object:
    """Run ``work``; print how long it took."""
    start = time.monotonic()
    done = work()
    print(f"{label}: {time.monotonic() - start:.1f} s", flush=True)
    return done


def seed_holder(holder: Holder) -> None:
    """Give ``holder`` an account, two keys, its generations, their charges and rollups."""
    from app.accounts.keys import create_key
    from app.accounts.passwords import register_account
    from app.generations.rollups import rebuild_rollups

    account = register_account(email=holder.email, password=PASSWORD)
    keys = [create_key(account_id=account.id, name=f"{holder.name}-{n}") for n in (1, 2)]
    holder.account_id, holder.key = account.id, keys[0].value
    holder.key_ids = (keys[0].id, keys[1].id)
    timed("  generations", lambda: write_generations(holder))
    timed("  ledger", lambda: charge_generations(holder))
    timed("  flask usage rebuild", lambda: rebuild_rollups(account_id=holder.account_id))
    analyze()


def write_generations(holder: Holder) -> None:
    """Write the holder's generations, newest now, spread evenly over SPAN (a day if short)."""
    from sqlalchemy import text

    from app.extensions import db

    span = SPAN if holder.generations > 1000 else timedelta(days=1)
    end = datetime.now(UTC).replace(tzinfo=None)
    step = span / holder.generations
    holder.a_generation = f"{holder.name}-{holder.generations // 2}"
    if db.engine.dialect.name == "postgresql":
        db.session.execute(text(POSTGRESQL_GENERATIONS), seed_parameters(holder, end, step))
    else:
        write_generations_in_batches(holder, end, step)
    db.session.commit()


POSTGRESQL_GENERATIONS = """
INSERT INTO generations (id, account_id, api_key_id, model, api, prompt_tokens,
    completion_tokens, cached_tokens, prompt_image_tokens, reasoning_tokens,
    cache_write_tokens, cost, shortfall, price_prompt, price_completion, price_cached_read,
    price_image, price_cache_write, status, finish_reason, streamed, estimated, latency_ms,
    created_at, request_id)
SELECT :name || '-' || n, :account_id,
    CASE WHEN n % 10 = 0 THEN NULL WHEN n % 2 = 0 THEN :key_1 ELSE :key_2 END,
    (ARRAY[:model_1, :model_2, :model_3])[1 + n % 3], 'chat', 100 + n % 50, 20 + n % 30,
    0, 0, 0, 0, (100 + n % 50) * :prompt_units + (20 + n % 30) * :completion_units, 0,
    CAST(:prompt_units AS bigint) * 1000000, CAST(:completion_units AS bigint) * 1000000, 0,
    0, CAST(:prompt_units AS bigint) * 1000000,
    'completed', 'stop', n % 4 = 0, false, 100 + n % 900,
    CAST(:end AS timestamp) - n * CAST(:step AS interval), 'req-' || n
FROM generate_series(1, :count) AS n
"""


def seed_parameters(holder: Holder, end: datetime, step: timedelta) -> dict[str, object]:
    """Return the parameters of POSTGRESQL_GENERATIONS for ``holder``."""
    return {
        "name": holder.name,
        "account_id": holder.account_id,
        "key_1": holder.key_ids[0],
        "key_2": holder.key_ids[1],
        "model_1": MODELS[0],
        "model_2": MODELS[1],
        "model_3": MODELS[2],
        "prompt_units": PROMPT_UNITS,
        "completion_units": COMPLETION_UNITS,
        "end": end,
        "step": step,
        "count": holder.generations,
    }


SQLITE_GENERATIONS = """
INSERT INTO generations (id, account_id, api_key_id, model, api, prompt_tokens,
    completion_tokens, cached_tokens, prompt_image_tokens, reasoning_tokens,
    cache_write_tokens, cost, shortfall, price_prompt, price_completion, price_cached_read,
    price_image, price_cache_write, status, finish_reason, streamed, estimated, latency_ms,
    created_at, request_id)
VALUES (?, ?, ?, ?, 'chat', ?, ?, 0, 0, 0, 0, ?, 0, ?, ?, 0, 0, ?, 'completed', 'stop', ?, 0,
    ?, ?, ?)
"""


def write_generations_in_batches(holder: Holder, end: datetime, step: timedelta) -> None:
    """Write SQLite's rows SEED_BATCH at a time, as the product stores them (times as text)."""
    from app.extensions import db

    connection = db.session.connection().connection.dbapi_connection
    prices = (PROMPT_UNITS * 1_000_000, COMPLETION_UNITS * 1_000_000, PROMPT_UNITS * 1_000_000)
    for first in range(1, holder.generations + 1, SEED_BATCH):
        last = min(first + SEED_BATCH, holder.generations + 1)
        connection.executemany(
            SQLITE_GENERATIONS,
            (sqlite_row(holder, n, end - n * step, prices) for n in range(first, last)),
        )
    connection.commit()


def sqlite_row(holder: Holder, n: int, moment: datetime, prices: tuple[int, ...]) -> tuple:
    """Return generation ``n``'s values for SQLITE_GENERATIONS."""
    prompt, completion = 100 + n % 50, 20 + n % 30
    key = None if n % 10 == 0 else holder.key_ids[n % 2 == 1]
    cost = prompt * PROMPT_UNITS + completion * COMPLETION_UNITS
    when = moment.isoformat(" ", "microseconds")
    return (f"{holder.name}-{n}", holder.account_id, key, MODELS[n % 3], prompt, completion,
            cost, *prices, n % 4 == 0, 100 + n % 900, when, f"req-{n}")  # fmt: skip


def charge_generations(holder: Holder) -> None:
    """Grant the holder enough, then charge each generation in the ledger, as settlement does."""
    from decimal import Decimal

    from sqlalchemy import text

    from app.credits.grants import grant_credits
    from app.extensions import db

    grant_credits(account_id=holder.account_id, amount=Decimal(10**6), description="bench")
    parameters = {"account_id": holder.account_id}
    db.session.execute(
        text(
            "INSERT INTO ledger_entries (account_id, kind, amount, generation_id, created_at) "
            "SELECT account_id, 'charge', -cost, id, created_at FROM generations "
            "WHERE account_id = :account_id"
        ),
        parameters,
    )
    db.session.execute(
        text(
            "UPDATE accounts SET balance = balance - (SELECT sum(cost) FROM generations "
            "WHERE account_id = :account_id) WHERE id = :account_id"
        ),
        parameters,
    )
    db.session.commit()
    chain_charges(holder.account_id)


def chain_charges(account_id: int) -> None:
    """Chain the charges written above after the grant, as settlement would have, a page at a time.

    Their digests are the app's own (app.credits.chain): the audit then finds the
    account's chain whole. The ledger's triggers let an entry not yet chained be chained
    once, which is all this writes.
    """
    from dataclasses import replace

    from sqlalchemy import select, update

    from app.credits.chain_audit import fields_of
    from app.credits.models import Account, LedgerEntry
    from app.extensions import db

    head = db.session.scalar(select(Account.ledger_head).where(Account.id == account_id))
    balance = db.session.scalar(
        select(LedgerEntry.balance_after)
        .where(LedgerEntry.account_id == account_id, LedgerEntry.entry_hash.is_not(None))
        .order_by(LedgerEntry.id.desc())
        .limit(1)
    )
    unchained = (
        select(LedgerEntry)
        .where(LedgerEntry.account_id == account_id, LedgerEntry.entry_hash.is_(None))
        .order_by(LedgerEntry.id)
    )
    after = 0
    while entries := db.session.scalars(
        unchained.where(LedgerEntry.id > after).limit(SEED_BATCH)
    ).all():
        chained = []
        for entry in entries:
            balance += entry.amount
            digest = replace(fields_of(entry), balance_after=balance, previous_hash=head).digest()
            chained.append(
                {"id": entry.id, "balance_after": balance, "previous_hash": head,
                 "entry_hash": digest}
            )  # fmt: skip
            head = digest
        db.session.execute(update(LedgerEntry), chained)
        db.session.expunge_all()
        after = entries[-1].id
    db.session.execute(update(Account).where(Account.id == account_id).values(ledger_head=head))
    db.session.commit()


def analyze() -> None:
    """Give PostgreSQL's planner the tables' statistics, as autovacuum would after a load."""
    from sqlalchemy import text

    from app.extensions import db

    if db.engine.dialect.name == "postgresql":
        db.session.commit()
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.execute(text("VACUUM ANALYZE"))


@contextmanager
def serving(database_url: str, catalog: Path, scratch: Path) -> Iterator[str]:
    """Serve the gateway on the database, one gevent worker; yield its base URL."""
    port = free_port()
    env = {**base_env(port, 1, 100), **gateway_env(database_url, catalog)}
    command = [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "wsgi:app"]
    with running(command, env, port, scratch / "gateway.log"):
        yield f"http://127.0.0.1:{port}"


def signed_in(url: str, holder: Holder) -> requests.Session:
    """Return a session signed in to the dashboard as ``holder``.

    Production's session cookie is Secure: it is sent by hand over this plain HTTP.
    """
    session = requests.Session()
    form = session.get(f"{url}/signin").text
    _send_cookies_by_hand(session)
    token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', form).group(1)
    data = {"csrf_token": token, "email": holder.email, "password": PASSWORD}
    response = session.post(f"{url}/signin", data=data, allow_redirects=False)
    assert response.status_code == 302, response.text[:500]
    _send_cookies_by_hand(session)
    return session


def _send_cookies_by_hand(session: requests.Session) -> None:
    session.headers["Cookie"] = "; ".join(f"{c.name}={c.value}" for c in session.cookies)


def reads(url: str, holder: Holder) -> dict[str, Callable[[requests.Session], int]]:
    """Return each read of ``holder``'s history: a call that returns the bytes it read."""
    today = datetime.now(UTC).date()
    month = today - timedelta(days=29)
    bearer = {"Authorization": f"Bearer {holder.key}"}
    pages = {
        "usage page": "/usage",
        "usage, one model": f"/usage?model={MODELS[1]}",
        "usage, one key": f"/usage?key={holder.key_ids[1]}",
        "usage, last 30 days": f"/usage?from={month}&to={today}",
        "keys page": "/keys",
        "balance page": "/balance",
    }
    found: dict[str, Callable[[requests.Session], int]] = {
        name: lambda session, path=path: page(session, url + path) for name, path in pages.items()
    }
    older: list[str] = []

    def next_page(session: requests.Session) -> int:
        # The Older link is found once, in the warm-up round: the history does not change.
        if not older:
            older.append(older_page_path(session, url))
        return page(session, url + older[0])

    found["usage, next page"] = next_page
    found["CSV, first MB"] = lambda session: csv_head(session, url)
    found["GET /v1/key"] = lambda session: api(url + "/v1/key", bearer)
    found["GET /v1/credits"] = lambda session: api(url + "/v1/credits", bearer)
    found["GET /v1/generations/{id}"] = lambda session: api(
        f"{url}/v1/generations/{holder.a_generation}", bearer
    )
    return found


def page(session: requests.Session, url: str) -> int:
    """GET a page; return its size."""
    response = session.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return len(response.content)


def older_page_path(session: requests.Session, url: str) -> str:
    """GET the usage page; return the path of the Older page its link leads to."""
    first = session.get(f"{url}/usage").text
    older = re.search(r'rel="next" href="([^"]+)"', first)
    assert older, "the usage page has no Older link"
    return older.group(1).replace("&amp;", "&")


def csv_head(session: requests.Session, url: str) -> int:
    """Read the CSV export until its first megabyte (or its end); return the bytes read."""
    read = 0
    with session.get(f"{url}/usage.csv", stream=True) as response:
        for chunk in response.iter_content(65_536):
            read += len(chunk)
            if read >= CSV_BYTES:
                break
    return read


def api(url: str, headers: dict[str, str]) -> int:
    """GET an API path with the key; return the body's size."""
    response = requests.get(url, headers=headers)
    assert response.status_code == 200, (url, response.text)
    return len(response.content)


def time_reads(
    url: str, holders: list[Holder], sessions: dict[str, requests.Session], rounds: int
) -> dict[str, dict[str, list[float]]]:
    """Time every read of each holder, interleaved, ``rounds`` times after a warm-up."""
    every = {holder.name: reads(url, holder) for holder in holders}
    timings: dict[str, dict[str, list[float]]] = {}
    for round_number in range(rounds + 1):
        for name in every[holders[0].name]:
            for holder in holders:
                start = time.perf_counter()
                every[holder.name][name](sessions[holder.name])
                elapsed = (time.perf_counter() - start) * 1000
                if round_number:
                    timings.setdefault(name, {}).setdefault(holder.name, []).append(elapsed)
    return timings


def print_table(timings: dict[str, dict[str, list[float]]]) -> None:
    """Print each read's median time for each account, the long one's ratio and excess.

    Against the account with 100 generations, and against the one with MID_GENERATIONS.
    """
    print(
        f"{'read':28} {'long ms':>9} {'short ms':>9} {'ratio':>6} {'+ms':>7}"
        f" {'mid ms':>9} {'ratio':>6} {'+ms':>7}"
    )
    for name, by_holder in timings.items():
        long, short, mid = (statistics.median(by_holder[h]) for h in ("long", "short", "mid"))
        print(
            f"{name:28} {long:9.1f} {short:9.1f} {long / short:6.2f} {long - short:7.1f}"
            f" {mid:9.1f} {long / mid:6.2f} {long - mid:7.1f}"
        )


def time_audits(app: Flask, holder: Holder) -> None:
    """Time the long account's audit: --full, then since the checkpoint it leaves."""
    from app.generations.audit import audit_ledger

    with app.app_context():
        for label, full in (("audit --full", True), ("audit since its checkpoint", False)):
            start = time.monotonic()
            report = audit_ledger([holder.account_id], full=full)
            print(
                f"{label}: {time.monotonic() - start:.2f} s, {report.generations} generations, "
                f"{len(report.mismatches)} mismatches"
            )


if __name__ == "__main__":
    main()
