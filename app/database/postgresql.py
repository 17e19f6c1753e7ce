"""PostgreSQL: statements that are durable without a convoy."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    Boolean,
    Executable,
    bindparam,
    case,
    func,
    literal_column,
    select,
    true,
)

_SYNCHRONOUS_COMMIT = literal_column("'synchronous_commit'")
_NOT_WAITING = literal_column("'off'")
COMMIT_WITHOUT_WAITING = func.set_config(_SYNCHRONOUS_COMMIT, _NOT_WAITING, true())
COMMIT_AS_CHOSEN = func.set_config(
    _SYNCHRONOUS_COMMIT,
    case(
        (
            bindparam("commit_waits", type_=Boolean()),
            func.current_setting(_SYNCHRONOUS_COMMIT),
        ),
        else_=_NOT_WAITING,
    ),
    true(),
)
# Commits as the server is configured to: txid_current() gives its transaction the id
# that makes it write a commit record, which it waits for the WAL to hold on disk, and
# the WAL up to it with it.
_FLUSH_WAL = select(func.txid_current())


class DurableStatements:
    """Statements run alone on PostgreSQL that are on disk when they return, without a convoy.

    A settlement updates its account's row, as every request paying from the account
    does. Committed synchronously, it keeps that row locked while PostgreSQL writes the
    WAL to disk, so under load the account's requests take their turns one disk write
    after another: at c=64, 70% of the floor's requests a second, against 79% with no
    request waiting for the disk at all (bench/RESULTS.md).

    Alone in the process, a statement commits as the server is configured to: one round
    trip. Beside another, it commits without waiting, which frees its rows at once, and
    waits instead for a flush of the WAL sent after it ended (_FLUSH_WAL), whose commit
    puts the WAL on disk up to its own commit record, past every commit before it. The
    statements waiting at once share one: whoever finds none on its way sends the next.
    So it returns, as a synchronous commit would, only once what it wrote is on disk.
    The choice is made on a count the process keeps without a lock: a wrong guess only
    costs a round trip or a turn in line.
    """

    def __init__(self, run: Callable[[Executable, dict[str, Any]], Sequence[Any]]) -> None:
        self.run = run
        self._running = 0
        self._flushes_sent = 0
        self._flushes_done = 0
        self._flushing = False
        self._failed: tuple[int, Exception] | None = None
        # A gevent condition in a worker: gunicorn's configuration patches threading first.
        self._flushed = threading.Condition()

    def execute(self, statement: Executable, parameters: dict[str, Any]) -> Sequence[Any]:
        """Run ``statement`` (which selects COMMIT_AS_CHOSEN); return its rows once on disk."""
        alone = self._running == 0
        self._running += 1
        try:
            rows = self.run(statement, {**parameters, "commit_waits": alone})
        finally:
            self._running -= 1
        if not alone:
            self._wait_for_flush()
        return rows

    def wait_for_disk(self) -> None:
        """Return once what this process committed before the call is on disk.

        For a transaction that committed without waiting (COMMIT_WITHOUT_WAITING), so
        that its rows were free before the disk write: it returns, as a synchronous
        commit would, once a shared flush sent after its commit is done.
        """
        self._wait_for_flush()

    def _wait_for_flush(self) -> None:
        """Return once a flush sent after this call is done; raise if that flush failed."""
        with self._flushed:
            needed = self._flushes_sent + 1
            while self._flushes_done < needed:
                if self._failed is not None and self._failed[0] >= needed:
                    raise self._failed[1]
                if self._flushing:
                    self._flushed.wait()
                else:
                    self._flush()

    def _flush(self) -> None:
        """Send the next flush, without holding the condition meanwhile."""
        self._flushing = True
        self._flushes_sent += 1
        number = self._flushes_sent
        self._flushed.release()
        try:
            self.run(_FLUSH_WAL, {})
        except Exception as error:
            # The waiters' outcome too. A sender that was killed (its request timed out)
            # says nothing of the server: one of them sends the flush again.
            self._failed = (number, error)
            raise
        else:
            self._flushes_done = number
        finally:
            self._flushed.acquire()
            self._flushing = False
            self._flushed.notify_all()
