"""Stored responses: kept for their account, read back by id and by chain, then deleted.

A response is found only by its own account, and only before it expires; otherwise it
is not found, whoever asks. A chain is read in two statements: its newest response's
bounds (how many responses, how many bytes), then, if they are within the gateway's, the
responses themselves. What is stored is the caller's content: nothing here logs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, insert, literal, select

from app.database import execute_alone, execute_on_driver, utcnow, write_transaction
from app.encoding import dumps, loads
from app.extensions import db
from app.responses.errors import ConversationTooLong, PreviousResponseNotFound
from app.responses.models import StoredResponse

# How many responses a chain may hold, the one a request adds included, and how many
# bytes its stored items may take (the body a request may send: 16 MiB). Past either,
# a continuation is refused before anything of the chain is read.
MAX_CHAIN_LENGTH = 256
MAX_CHAIN_BYTES = 16 * 1024 * 1024
MAX_ID_LENGTH = 64

_TABLE = StoredResponse.__table__
# Built once: a statement costs more CPU to construct than to execute. Run alone (on
# PostgreSQL), the insert returns its id, since a statement run alone returns its rows.
_INSERT = insert(_TABLE)
_INSERT_ALONE = insert(_TABLE).returning(_TABLE.c.id)


@dataclass(frozen=True)
class Chain:
    """The stored responses a request continues: their items, oldest first, and their size."""

    response_id: str | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    length: int = 0
    size: int = 0
    # The ids of its responses: the items the gateway named are theirs.
    response_ids: frozenset[str] = frozenset()


def find_stored(account_id: int, response_id: str) -> StoredResponse | None:
    """Return the account's stored response ``response_id``, unless it expired; or None."""
    if len(response_id) > MAX_ID_LENGTH:
        return None
    stored = db.session.get(StoredResponse, response_id)
    db.session.commit()
    if stored is None or stored.account_id != account_id or stored.expires_at <= utcnow():
        return None
    return stored


def stored_items(stored: StoredResponse) -> list[dict[str, Any]]:
    """Return what a stored response adds to its chain: its input items, then its output."""
    return loads(stored.input_items) + loads(stored.response)["output"]


def find_chain(account_id: int, response_id: str) -> Chain:
    """Return the chain that ends with the account's response ``response_id``.

    :raise PreviousResponseNotFound: it is not stored for the account, or a response of
        its chain was deleted or expired since.
    :raise ConversationTooLong: a response continuing it would pass the chain's bounds.
    """
    head = _chain_head(account_id, response_id)
    if head is None:
        raise PreviousResponseNotFound(response_id, param="previous_response_id")
    length, size = head
    if length >= MAX_CHAIN_LENGTH or size > MAX_CHAIN_BYTES:
        raise ConversationTooLong(
            f"The conversation of '{response_id}' is too long to continue: a chain holds at "
            f"most {MAX_CHAIN_LENGTH} responses and {MAX_CHAIN_BYTES // 2**20} MiB. Start a "
            "new one, sending the input it needs.",
            param="previous_response_id",
        )
    rows = _chain_rows(account_id, response_id, length)
    if len(rows) < length:
        raise PreviousResponseNotFound(
            response_id,
            param="previous_response_id",
            message=f"The conversation of '{response_id}' cannot be continued: an earlier "
            "response of it was deleted or expired.",
        )
    items = [item for row in reversed(rows) for item in stored_items(row)]
    return Chain(response_id, items, length, size, frozenset(row.id for row in rows))


def _chain_head(account_id: int, response_id: str) -> tuple[int, int] | None:
    if len(response_id) > MAX_ID_LENGTH:
        return None
    head = db.session.execute(
        select(_TABLE.c.chain_length, _TABLE.c.chain_bytes).where(
            _TABLE.c.id == response_id,
            _TABLE.c.account_id == account_id,
            _TABLE.c.expires_at > utcnow(),
        )
    ).first()
    db.session.commit()
    return None if head is None else (head.chain_length, head.chain_bytes)


def _chain_rows(account_id: int, response_id: str, length: int) -> list[Any]:
    """Read the chain's responses, newest first, following each to the one it continued."""
    now = utcnow()
    columns = (_TABLE.c.id, _TABLE.c.previous_response_id, _TABLE.c.input_items, _TABLE.c.response)
    alive = (_TABLE.c.account_id == account_id, _TABLE.c.expires_at > now)
    chain = (
        select(*columns, literal(1).label("step"))
        .where(_TABLE.c.id == response_id, *alive)
        .cte("chain", recursive=True)
    )
    chain = chain.union_all(
        select(*columns, chain.c.step + 1)
        .join(chain, _TABLE.c.id == chain.c.previous_response_id)
        .where(chain.c.step < length, *alive)
    )
    rows = db.session.execute(select(chain).order_by(chain.c.step)).all()
    db.session.commit()
    return rows


def save_response(
    *,
    account_id: int,
    chain: Chain,
    input_items: list[dict[str, Any]],
    response: dict[str, Any],
    ttl_days: int,
) -> None:
    """Store ``response`` and its request's ``input_items`` as the next of ``chain``."""
    stored_input, stored_response = dumps(input_items), dumps(response)
    now = utcnow()
    row = {
        "id": response["id"],
        "account_id": account_id,
        "previous_response_id": chain.response_id,
        "chain_length": chain.length + 1,
        "chain_bytes": chain.size + len(stored_input) + len(stored_response),
        "input_items": stored_input,
        "response": stored_response,
        "created_at": now,
        "expires_at": now + timedelta(days=ttl_days),
    }
    write_transaction(
        lambda connection: execute_on_driver(connection, _INSERT, row),
        alone=lambda: execute_alone(_INSERT_ALONE, row),
    )


def delete_response(account_id: int, response_id: str) -> bool:
    """Delete the account's stored response ``response_id``; return whether there was one."""
    if find_stored(account_id, response_id) is None:
        return False
    statement = delete(StoredResponse).where(
        StoredResponse.id == response_id, StoredResponse.account_id == account_id
    )
    write_transaction(lambda connection: connection.execute(statement))
    return True


def prune_expired_responses(*, batch_size: int) -> int:
    """Delete up to ``batch_size`` stored responses past their time; return how many went."""
    expired = (
        select(StoredResponse.id)
        .where(StoredResponse.expires_at <= utcnow())
        .order_by(StoredResponse.expires_at)
        .limit(batch_size)
    )
    ids = list(db.session.scalars(expired))
    db.session.commit()
    if ids:
        statement = delete(StoredResponse).where(StoredResponse.id.in_(ids))
        write_transaction(lambda connection: connection.execute(statement))
    return len(ids)
