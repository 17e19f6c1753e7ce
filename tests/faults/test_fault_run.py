"""The fault run: the real service under load while its processes and connections fail.

gunicorn (two gevent workers, holds that expire after 4 s) serves eight caller threads
over four accounts, one of them nearly out of credits, for FAULT_RUN_SECONDS (40 s by
default): streamed and whole chat completions, some with tools, some streams hung up by
their caller, some whole ones under an Idempotency-Key retried as the openai SDK does.
The upstream is a process of its own (tests/faults/upstream.py) whose streams last
seconds. A schedule drawn from the seed spreads the faults over the run: workers
SIGKILLed mid-stream, the gateway's PostgreSQL connections terminated (under load, and
with only settlements to come), Redis paused, the upstream stopped for 3 s, the master
restarted on the same port.

Once the load stops and the holds' TTL has passed, the run's accounts must show:

1. no mismatch in the ledger's audit;
2. each balance equal to its grants less its charges, never negative;
3. every cost a caller was told (a whole answer's, a stream's usage chunk's) equal to its
   generation's recorded cost and its ledger charge;
4. every Idempotency-Key charged at most once, its claim naming the charged generation;
5. every stream that delivered text before it broke, charged;
6. no hold still open;
7. every error in the envelope, in a status or an SSE event, and none a server error
   but a 500 of a request running while its connection was terminated under it (reads
   in a request's session are not run again; a connection that died idle never fails
   a request);
8. right after the faults, fresh requests all answered;
9. no worker's background loop (renewals, sweeper, alert deliverer) failed on an error
   it did not expect.

A worker records a stream's progress before its first output and then every
STREAM_PROGRESS_SECONDS (1 s); a stream whose worker dies is settled from its last
record, at the most its request could use unless its upstream had ended it, so check 5
leaves no room: a stream that delivered anything is charged.

A failure names the seed and the check; replay it with ``FAULT_RUN_SEEDS=N pytest
tests/faults`` (with TEST_DATABASE_URL for PostgreSQL). Run more seeds or longer with
``FAULT_RUN_SEEDS=1,2,3 FAULT_RUN_SECONDS=120``.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from app.sweeper import sweep_interval
from tests.factories import AccountFactory
from tests.faults import checks
from tests.faults.faults import Faults, Gateway, fault_schedule
from tests.faults.load import Attempt, Caller, Load, stream_body, whole_body

HOLD_TTL_SECONDS = 4
RICH, POOR = Decimal("20"), Decimal("0.05")
# Each caller's account, by index among the run's accounts: one caller is nearly broke.
CALLER_ACCOUNTS = (0, 1, 2, 0, 1, 2, 3, 0)
# The callers that start with an answer slower than they wait for (their retries come
# past the TTL while it still runs); they call from rich accounts.
FIRST_SLOW = (0, 5)
# The load goes on this long after the last fault, so that the gateway meets load again.
AFTER_LAST_FAULT = 2.0
LIVENESS_REQUESTS = 6
LIVENESS_SECONDS = 5


def make_callers(app) -> list[Caller]:
    """Create the run's accounts (three funded, one nearly out of credits) and their keys."""
    callers = []
    with app.app_context():
        for credits in (RICH, RICH, RICH, POOR):
            account, issued = AccountFactory.with_key(credits=credits)
            callers.append(Caller(account.id, issued.value))
    return callers


def run_load(load: Load, faults: Faults, schedule: list, callers: list[Caller], seconds: float):
    """Run the callers and the faults; stop the load a little after the last fault."""
    started = time.monotonic()
    threads = [
        threading.Thread(
            target=load.run_caller,
            args=(callers[account], index, index in FIRST_SLOW),
            daemon=True,
        )
        for index, account in enumerate(CALLER_ACCOUNTS)
    ]
    for thread in threads:
        thread.start()
    failure: list[BaseException] = []

    def do_faults() -> None:
        try:
            faults.run(schedule, started)
        except BaseException as error:  # re-raised below, after the load has stopped
            failure.append(error)

    fault_thread = threading.Thread(target=do_faults, daemon=True)
    fault_thread.start()
    fault_thread.join(timeout=seconds + 180)
    end = max(started + seconds, faults.last_done_at + AFTER_LAST_FAULT)
    time.sleep(max(0.0, end - time.monotonic()))
    load.stop.set()
    load.admit.set()
    for thread in threads:
        thread.join(timeout=60)
    if failure:
        raise failure[0]
    assert not fault_thread.is_alive(), "the faults did not end in time"
    assert not any(thread.is_alive() for thread in threads), "a caller did not stop"


def liveness(load: Load, caller: Caller) -> list[str]:
    """Check 8: fresh requests right after the faults are all answered, whole or streamed."""
    rng = random.Random(load.seed)
    done: list[Attempt] = []

    def one(index: int) -> None:
        if index % 2:
            done.append(load.whole(caller, whole_body(rng, tools=False), LIVENESS_SECONDS))
        else:
            body = stream_body(rng, tools=False)
            done.append(load.stream(caller, body, hang_up_after=None))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(LIVENESS_REQUESTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return [
        f"{a.request_id} ({checks.describe(a)}): {a.error_body}"
        for a in done
        if a.outcome not in ("answered", "done")
    ] + [f"{LIVENESS_REQUESTS - len(done)} requests never ended"] * (len(done) < LIVENESS_REQUESTS)


def wait_for_holds(database_url: str, account_ids: list[int]) -> list[str]:
    """Wait for the holds to expire and be swept (the TTL and a few sweeps); return open ones."""
    deadline = time.monotonic() + HOLD_TTL_SECONDS + 4 * sweep_interval(HOLD_TTL_SECONDS) + 5
    while (remaining := checks.open_holds(database_url, account_ids)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.25)
    return remaining


def summary(load: Load, faults: Faults, excused) -> str:
    """Say what the run did: its faults, its attempts by kind and outcome, excused 500s."""
    outcomes = Counter(
        f"{'stream' if a.streamed else 'keyed' if a.key else 'whole'} {a.status} {a.outcome}"
        for a in load.attempts
    )
    lines = ["faults:", *faults.log, "attempts:"]
    lines += [f"  {count:4d} {what}" for what, count in sorted(outcomes.items())]
    broken = [a for a in load.attempts if a.streamed and a.outcome != "done" and a.texts]
    lines.append(f"streams broken after some text: {len(broken)}")
    lines += [
        f"500 of a connection terminated in use: {a.request_id} ({checks.describe(a)})"
        for a in load.attempts
        if excused(a)
    ]
    return "\n".join(lines)


def failure_report(seed: int, backend: str, failed: list, run_summary: str, logs: Path) -> str:
    """Say which checks failed, with what, and how to replay the run."""
    lines = [f"the fault run with seed {seed} on {backend} failed:"]
    for name, problems in failed:
        lines.append(f"check {name}: {len(problems)} problems")
        lines += [f"  - {problem}" for problem in problems[:15]]
    database = " TEST_DATABASE_URL=..." if backend == "postgresql" else ""
    lines += [
        run_summary,
        f"replay:{database} FAULT_RUN_SEEDS={seed} pytest tests/faults",
        f"gunicorn logs: {logs}",
    ]
    return "\n".join(lines)


def test_fault_run(
    app, database_url, fault_seed, fault_run_seconds, fake_upstream, fault_catalog, redis_port,
    tmp_path,
):  # fmt: skip
    backend = "postgresql" if database_url.startswith("postgresql") else "sqlite"
    callers = make_callers(app)
    account_ids = [caller.account_id for caller in callers]
    schedule = fault_schedule(fault_seed, fault_run_seconds, postgres=backend == "postgresql")
    env = {
        "WEB_CONCURRENCY": "2",
        "HOLD_TTL_SECONDS": str(HOLD_TTL_SECONDS),
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
    }
    logs = tmp_path / "gunicorn"
    logs.mkdir()
    with Gateway(database_url, logs, fault_catalog, env) as gateway:
        load = Load(gateway.url, fault_seed)
        faults = Faults(gateway, load, fake_upstream.process, redis_port, database_url)
        run_load(load, faults, schedule, callers, fault_run_seconds)
        load.stop.clear()
        alive = liveness(load, callers[0])
        remaining = wait_for_holds(database_url, account_ids)
    excused = checks.killed_in_use(gateway.logs(), faults.open_terminations)
    books = checks.read_books(database_url, account_ids)
    attempts = load.attempts
    failed = checks.run_checks(
        [
            ("1 (audit)", lambda: checks.audit_mismatches(database_url, fault_catalog, books)),
            ("2 (balances)", lambda: checks.balances(books)),
            ("3 (costs told)", lambda: checks.answered_costs(books, attempts)),
            ("4 (keys charged once)", lambda: checks.keys_charged_once(books, attempts)),
            ("5 (broken streams billed)", lambda: checks.broken_streams_billed(books, attempts)),
            ("6 (no open holds)", lambda: checks.no_open_holds(remaining)),
            ("7 (error envelopes)", lambda: checks.errors_in_envelope(attempts, excused)),
            ("8 (liveness)", lambda: alive),
            ("9 (background duties)", lambda: checks.duties_failed(gateway.logs())),
        ]
    )
    run_summary = summary(load, faults, excused)
    print(run_summary)
    if failed:
        pytest.fail(failure_report(fault_seed, backend, failed, run_summary, logs), pytrace=False)
