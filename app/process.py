"""The process's id without a system call, for the code that must notice a fork.

A connection, a cache or a metrics file opened by gunicorn's master, or by a worker
before it forked a child, belongs to that process: code holding one checks on every use
that it still runs in the process that opened it. ``os.getpid()`` is a system call, and
a request made about twenty such checks; ``process_id()`` reads a copy that a fork hook
keeps current (``os.fork`` runs it in the child, as gunicorn's and multiprocessing's
forks do).
"""

from __future__ import annotations

import os

_pid = os.getpid()


def _forked() -> None:
    global _pid  # noqa: PLW0603 - the one copy the fork hook keeps current
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def process_id() -> int:
    """Return this process's id, as ``os.getpid()`` would."""
    return _pid
