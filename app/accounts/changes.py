"""An organisation's audit log: who changed what, and when.

Every change to members, roles, keys, grants (and, in their own modules, budgets and
alerts) is recorded with ``record_change`` in the transaction that makes it, so the log
holds exactly the changes that happened.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.accounts.models import Change, Person
from app.extensions import db

CHANGES_SHOWN = 200


def record_change(
    actor: int | None,
    organisation: int,
    action: str,
    subject: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """Add a change to the session, for the caller to commit with the change itself.

    ``actor`` is the person's id (None for the operator's commands), ``organisation``
    the account's id, ``action`` a dotted verb (``member.role``), ``subject`` what
    changed (``member:7``), ``detail`` how (no secrets: key values never go here).
    """
    db.session.add(
        Change(
            actor_id=actor, account_id=organisation, action=action, subject=subject, detail=detail
        )
    )


def recent_changes(account_id: int, limit: int = CHANGES_SHOWN) -> list[tuple[Change, str | None]]:
    """Return the organisation's latest changes, newest first, with their actor's email."""
    rows = db.session.execute(
        select(Change, Person.email)
        .outerjoin(Person, Person.id == Change.actor_id)
        .where(Change.account_id == account_id)
        .order_by(Change.id.desc())
        .limit(limit)
    )
    return [(change, email) for change, email in rows]
