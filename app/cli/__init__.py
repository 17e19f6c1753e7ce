"""Operator commands: ``flask GROUP COMMAND``, one module per group (GROUPS lists them).

One module per command group. Each command parses its arguments, calls the domain and
echoes the result. A value meant for scripts (a key, a link, a secret) is printed alone
on the last line of stdout, so that ``KEY=$(flask keys create ... | tail -1)`` works.
Wrong input: one line on stderr, exit 1.
"""

from __future__ import annotations

from flask import Flask
from flask.cli import AppGroup

from app.cli.accounts import accounts_cli
from app.cli.alerts import alerts_cli
from app.cli.catalog import catalog_cli
from app.cli.credits import credits_cli
from app.cli.demo import DEMO_EMAIL, demo_cli
from app.cli.keys import keys_cli
from app.cli.ledger import ledger_cli
from app.cli.orgs import orgs_cli
from app.cli.payments import codes_cli, payments_cli
from app.cli.usage import usage_cli

__all__ = ["DEMO_EMAIL", "GROUPS", "register"]

GROUPS: tuple[AppGroup, ...] = (
    accounts_cli,
    credits_cli,
    keys_cli,
    catalog_cli,
    ledger_cli,
    usage_cli,
    demo_cli,
    orgs_cli,
    alerts_cli,
    codes_cli,
    payments_cli,
)


def register(app: Flask, groups: tuple[AppGroup, ...] = GROUPS) -> None:
    """Add the command groups to ``app.cli``."""
    for group in groups:
        app.cli.add_command(group)
