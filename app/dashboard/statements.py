"""The Balance page's statements: each month's signed statement, as JSON or as CSV.

Owners and admins download them, as they see the ledger they list. The JSON is the
signed statement the API answers, which tools/verify_statement.py checks; the CSV is
the same entries for a spreadsheet, between an ``opening`` and a ``closing`` row that
carry the balance and the chain's head before and after them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Response
from flask_login import current_user

from app.accounts.models import ADMIN
from app.dashboard.formatting import csv_cell, csv_text
from app.dashboard.security import role_required
from app.dashboard.views import bp
from app.database import utcnow
from app.encoding import dumps
from app.ledger_statements.periods import parse_period
from app.ledger_statements.statement import organisation, signed_statement
from app.money import usd_text

CSV_COLUMNS = (
    "entry_id",
    "time_utc",
    "kind",
    "amount_usd",
    "balance_after_usd",
    "generation_id",
    "reference",
    "previous_hash",
    "entry_hash",
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _statement(period: str) -> dict[str, Any]:
    now = utcnow()
    account = organisation(current_user.account_id)
    return signed_statement(account=account, period=parse_period(period, now=now), now=now)


def _download(body: str | bytes, mimetype: str, filename: str) -> Response:
    return Response(
        body,
        mimetype=mimetype,
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@bp.get("/balance/statements/<period>.json")
@role_required(ADMIN)
def statement_json(period: str) -> Response:
    """Download the organisation's signed statement of ``period``."""
    statement = _statement(period)
    name = f"statement-{statement['account_id']}-{statement['period']}.json"
    return _download(dumps(statement), "application/json", name)


@bp.get("/balance/statements/<period>.csv")
@role_required(ADMIN)
def statement_csv(period: str) -> Response:
    """Download the entries of the organisation's statement of ``period`` as CSV."""
    statement = _statement(period)
    name = f"statement-{statement['account_id']}-{statement['period']}.csv"
    return _download(statement_csv_text(statement), "text/csv", name)


def statement_csv_text(statement: dict[str, Any]) -> str:
    """Return the statement's entries as CSV, between its opening and closing rows."""
    opening = ("", statement["from"], "opening", "", statement["opening_balance_units"])
    closing = ("", statement["to"], "closing", "", statement["closing_balance_units"])
    rows = [(*opening, "", "", "", statement["opening_hash"])]
    rows += [_entry_row(entry) for entry in statement["entries"]]
    rows.append((*closing, "", "", "", statement["closing_hash"]))
    lines = [",".join(CSV_COLUMNS)]
    lines += [",".join(csv_cell(cell) for cell in _cells(row)) for row in rows]
    return "\r\n".join(lines) + "\r\n"


def _entry_row(entry: dict[str, Any]) -> tuple[Any, ...]:
    moment = _EPOCH + timedelta(microseconds=entry["time_micros"])
    return (
        entry["id"],
        moment.isoformat().replace("+00:00", "Z"),
        entry["kind"],
        entry["amount_units"],
        entry["balance_after_units"],
        entry["generation_id"] or "",
        entry["reference"] or "",
        entry["previous_hash"] or "",
        entry["entry_hash"] or "",
    )


def _cells(row: tuple[Any, ...]) -> list[str]:
    """Write a row's amounts (units) in USD, and its texts as spreadsheets keep them text."""
    entry_id, time, kind, amount, balance, *texts = row
    amounts = [usd_text(value) if isinstance(value, int) else "" for value in (amount, balance)]
    return [str(entry_id), time, csv_text(kind), *amounts, *(csv_text(text) for text in texts)]
