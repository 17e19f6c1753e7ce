"""Accounts, their holds and the append-only ledger of balance changes."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    text,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.credits.chain import GENESIS
from app.database import Money, UTCDateTime, utcnow
from app.extensions import db

# A ledger entry's kind; a hold's state: open while its request runs, then settled by its
# charge, or expired when its worker died and nothing was charged; or voided: its request
# was given up for another (a retry took its Idempotency-Key over), and charges nothing.
# A take-back is a payment's credit returned to its payer (a refund, a lost dispute).
GRANT, CHARGE, TAKE_BACK = "grant", "charge", "take_back"
OPEN, SETTLED, EXPIRED, VOIDED = "open", "settled", "expired", "voided"


class Account(db.Model):
    """An organisation, who pays: a balance, and the part of it held by requests in flight.

    ``balance`` always equals the sum of the account's ledger entries; ``reserved`` is the
    sum of its open holds. The conditional UPDATEs in ``ledger`` keep every hold within
    ``balance - reserved``; the balance itself goes below zero only when a payment is
    taken back (a refund, a dispute) after its credits were spent: the organisation is
    then in debt, and refused every request until it pays it back.
    """

    __tablename__ = "accounts"
    __table_args__ = (CheckConstraint("reserved >= 0", name="reserved_not_negative"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The organisation's name, shown to its members; ``email`` is the holder's address of
    # an account made before organisations (None for an organisation made since).
    name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str | None] = mapped_column(String(320), unique=True, nullable=True)
    balance = mapped_column(Money, nullable=False, default=0)
    reserved = mapped_column(Money, nullable=False, default=0)
    # Balance under which the organisation is alerted (a trigger writes the event).
    alert_below = mapped_column(Money, nullable=True)
    # Share (1-99) of a member's or key's budget at which the organisation is alerted
    # before it is used up (None: only when used up); triggers read it.
    budget_alert_percent: Mapped[int | None] = mapped_column(
        SmallInteger, nullable=True, default=80, server_default="80"
    )
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    # The digest of the account's last ledger entry (app.credits.chain), written by the
    # UPDATE that changes the balance: where the chain's next entry starts.
    ledger_head: Mapped[str] = mapped_column(
        String(64), nullable=False, default=GENESIS, server_default=GENESIS
    )


class LedgerEntry(db.Model):
    """One change of an account's balance: a grant (positive) or a charge (negative).

    Rows are only ever inserted. A charge names its generation, and a generation can be
    charged once (unique ``generation_id``); a grant may carry the operator's idempotency
    key, unique per account. Each entry is chained to the account's entry before it
    (app.credits.chain): ``entry_hash`` covers its fields, the balance it left and
    ``previous_hash``.
    """

    __tablename__ = "ledger_entries"
    # A charge writes one index entry by account: (account_id, id) serves the ledger
    # page and the audit's entries since its checkpoint; a grant's idempotency key is
    # unique among the entries that have one, which charges never do; an account's
    # grants are found among its grants alone (GET /v1/credits).
    __table_args__ = (
        Index("ix_ledger_entries_account_id_id", "account_id", "id"),
        Index(
            "ix_ledger_entries_grants",
            "account_id",
            sqlite_where=text("kind = 'grant'"),
            postgresql_where=text("kind = 'grant'"),
        ),
        Index(
            "uq_ledger_entries_grant_idempotency_key",
            "account_id",
            "idempotency_key",
            unique=True,
            sqlite_where=text("idempotency_key IS NOT NULL"),
            postgresql_where=text("idempotency_key IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    kind: Mapped[str] = mapped_column(String(16))
    amount = mapped_column(Money, nullable=False)
    generation_id: Mapped[str | None] = mapped_column(String(64), unique=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    description: Mapped[str | None] = mapped_column(String(255))
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    # None only for an entry written before the chain, until migration 0029 chains it.
    balance_after = mapped_column(Money, nullable=True)
    previous_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    entry_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)


class Hold(db.Model):
    """Credit set aside for one request in flight, at its worst-case cost.

    A hold is open until the request settles (``settled``) or until it expires because
    the worker serving it died (``expired``); only open holds count in
    ``Account.reserved``. ``api_key_id`` names the key the hold was placed with, on
    whose row (and its member's) it may also have reserved, so that settling or expiring
    it releases that too; it is no foreign key, since holds outlive the keys they were
    placed with.
    """

    __tablename__ = "holds"
    __table_args__ = (
        # The sweeper's and the gauge's: the few open holds among every hold ever placed.
        Index(
            "ix_holds_open_expires_at",
            "expires_at",
            sqlite_where=text("status = 'open'"),
            postgresql_where=text("status = 'open'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    amount = mapped_column(Money, nullable=False)
    api_key_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default=OPEN)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    expires_at = mapped_column(UTCDateTime, nullable=False)
    # A stream's record of what it delivered so far, kept by its worker: what the hold is
    # settled at if it expires (the worker died) before the stream settled it.
    progress = mapped_column(JSON, nullable=True)
    # The starts of the key's and of its member's budget windows the hold was placed in
    # (app.budgets): its charge counts in those windows, even if it settles in the next.
    key_window_start: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    member_window_start: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Whether the hold's amount is in its key's and its member's ``window_reserved``:
    # only a row that has a budget (or a rolling window) is reserved on, and a budget
    # set later takes over the holds already open (app.accounts.budgets). What ends the
    # hold gives back exactly what it notes.
    reserved_on_key: Mapped[bool] = mapped_column(
        Boolean, nullable=False, default=True, server_default=true()
    )
    reserved_on_member: Mapped[bool] = mapped_column(
        Boolean, nullable=False, default=True, server_default=true()
    )


# The key a rollup of charges made without a key is filed under: rows of a unique key
# cannot hold NULL and still meet on conflict.
NO_KEY = 0


class UsageRollup(db.Model):
    """What one account's key spent on one model in one UTC hour: requests, tokens, money.

    Written by every settlement, in its own transaction, so that history is read from a
    row an hour and not from every generation ever recorded; ``flask ledger audit``
    holds it to the raw generations, and ``flask usage rebuild`` recomputes it from them.
    """

    __tablename__ = "usage_rollups"
    # A settlement updates its row's sums, never these columns: the indexes are written
    # once an hour per row, not per request. Reads by time name the account, or the key.
    __table_args__ = (
        Index("ix_usage_rollups_account_id_hour", "account_id", "hour"),
        Index("ix_usage_rollups_account_id_api_key_id_hour", "account_id", "api_key_id", "hour"),
        Index("ix_usage_rollups_hour", "hour"),
    )

    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    # The key's id, or NO_KEY; no foreign key, as a rollup outlives the key's row.
    api_key_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour = mapped_column(UTCDateTime, primary_key=True)
    requests: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    prompt_tokens = mapped_column(BigInteger, nullable=False, default=0)
    cached_tokens = mapped_column(BigInteger, nullable=False, default=0)
    completion_tokens = mapped_column(BigInteger, nullable=False, default=0)
    reasoning_tokens = mapped_column(BigInteger, nullable=False, default=0)
    cost = mapped_column(Money, nullable=False, default=0)
    shortfall = mapped_column(Money, nullable=False, default=0)
