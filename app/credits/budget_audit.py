"""The budget counters of keys and members against the holds they count.

A row's ``window_reserved`` must equal the sum of its open holds that reserved on it
(a hold reserves only on a row with a budget, or that a budget set since took over),
and its ``window_spent`` the charges of its settled holds placed in its current window
(those whose noted window start is the row's): a charge counts in the window it was
held in.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, bindparam, case, func, select

from app.auth.models import ApiKey
from app.credits.models import CHARGE, OPEN, Hold, LedgerEntry
from app.credits.sql.guards import memberships
from app.extensions import db


def budget_mismatches(account_ids: list[int]) -> Iterator[tuple[int, str, str]]:
    """Yield (account id, subject, problem) for each key or member whose counters are off."""
    for subject, window, reserved_on in (
        ("key", Hold.key_window_start, Hold.reserved_on_key),
        ("member", Hold.member_window_start, Hold.reserved_on_member),
    ):
        query = _counters_against_holds(subject, window, reserved_on)
        rows = db.session.execute(query, {"ids": account_ids})
        for account_id, row_id, spent, reserved, charged, held in rows:
            charged, held = charged or Decimal(0), held or Decimal(0)
            if spent != charged:
                problem = f"spent ${spent:f} in its window but its holds were charged ${charged:f}"
                yield account_id, f"{subject} {row_id}", problem
            if reserved != held:
                problem = f"reserved ${reserved:f} but its open holds sum to ${held:f}"
                yield account_id, f"{subject} {row_id}", problem


def _counters_against_holds(subject: str, window: Any, reserved_on: Any) -> Any:
    """Return each key's (or member's) counters beside the sums of its holds and charges."""
    row = ApiKey.id if subject == "key" else memberships.c.id
    row_window = ApiKey.window_start if subject == "key" else memberships.c.window_start
    charged_in_window = case(
        (and_(Hold.status != OPEN, window == row_window), -LedgerEntry.amount), else_=0
    )
    held = case((and_(Hold.status == OPEN, reserved_on), Hold.amount), else_=0)
    query = (
        select(
            ApiKey.account_id,
            row,
            (ApiKey.window_spent if subject == "key" else memberships.c.window_spent),
            (ApiKey.window_reserved if subject == "key" else memberships.c.window_reserved),
            func.sum(charged_in_window),
            func.sum(held),
        )
        .select_from(ApiKey)
        .join(memberships, memberships.c.id == ApiKey.member_id)
        .outerjoin(Hold, Hold.api_key_id == ApiKey.id)
        .outerjoin(
            LedgerEntry, and_(LedgerEntry.generation_id == Hold.id, LedgerEntry.kind == CHARGE)
        )
        .where(ApiKey.account_id.in_(bindparam("ids", expanding=True)))
        .group_by(ApiKey.account_id, row)
    )
    return query
