"""ledger entries are hash-chained per account; the account keeps the chain's head

Each entry gets the balance it left, the digest of the account's entry before it and
its own (app.credits.chain, docs/concepts/ledger-chain.md); each account the digest of
its last entry, ``ledger_head``. The entries already there are chained here, in the
order of their ids, one account at a time in a transaction of its own, its row locked
meanwhile (the app's writes to other accounts go on), its entries written a page at a
time.

The append-only triggers let an entry not yet chained be chained, once: its chain's
columns written, none of its own changed. Everything else is still refused.

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-29 09:00:00

"""

import hashlib
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

GENESIS = "0" * 64
MESSAGE = "ledger entries are append-only"
PAGE = 1000
# The columns an entry is written with, that chaining it must leave as they are.
OWN_COLUMNS = (
    "id",
    "account_id",
    "kind",
    "amount",
    "generation_id",
    "idempotency_key",
    "description",
    "created_at",
)
_EPOCH = datetime(1970, 1, 1)


def upgrade():
    op.add_column(
        "accounts",
        sa.Column("ledger_head", sa.String(64), nullable=False, server_default=GENESIS),
    )
    op.add_column("ledger_entries", sa.Column("balance_after", sa.BigInteger(), nullable=True))
    op.add_column("ledger_entries", sa.Column("previous_hash", sa.String(64), nullable=True))
    op.add_column("ledger_entries", sa.Column("entry_hash", sa.String(64), nullable=True))
    _let_entries_be_chained_once()
    with op.get_context().autocommit_block():
        engine = op.get_bind().engine
        with engine.connect() as connection:
            account_ids = connection.execute(sa.text("SELECT id FROM accounts ORDER BY id"))
            account_ids = [row[0] for row in account_ids]
        for account_id in account_ids:
            with engine.begin() as connection:
                _chain_account(connection, account_id)


def _let_entries_be_chained_once():
    unchanged = " AND ".join(f"NEW.{name} IS NOT DISTINCT FROM OLD.{name}" for name in OWN_COLUMNS)
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            f"""
            CREATE OR REPLACE FUNCTION ledger_entries_append_only() RETURNS trigger AS $$
            BEGIN
                IF TG_OP = 'UPDATE' AND OLD.entry_hash IS NULL AND {unchanged} THEN
                    RETURN NEW;
                END IF;
                RAISE EXCEPTION '{MESSAGE}';
            END;
            $$ LANGUAGE plpgsql
            """
        )
        return
    unchanged = unchanged.replace("IS NOT DISTINCT FROM", "IS")
    op.execute("DROP TRIGGER ledger_entries_no_update")
    op.execute(
        "CREATE TRIGGER ledger_entries_no_update BEFORE UPDATE ON ledger_entries "
        f"WHEN NOT (OLD.entry_hash IS NULL AND {unchanged}) "
        f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
    )


def _text_field(value):
    return "-" if value is None else f"{len(value)}:{value}"


def _micros(value):
    if isinstance(value, str):  # SQLite's text
        value = datetime.fromisoformat(value)
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _digest(row, balance, previous):
    """app.credits.chain.ChainedFields.digest, as it is at this revision."""
    text = "|".join(
        (
            "ledger-v1",
            str(row.id),
            str(row.account_id),
            row.kind,
            str(row.amount),
            str(balance),
            _text_field(row.generation_id),
            _text_field(row.idempotency_key),
            str(_micros(row.created_at)),
            previous,
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _chain_account(connection, account_id):
    """Chain the account's entries not chained yet after its head; move its head to the last."""
    lock = " FOR UPDATE" if connection.dialect.name == "postgresql" else ""
    head = connection.execute(
        sa.text(f"SELECT ledger_head FROM accounts WHERE id = :id{lock}"), {"id": account_id}
    ).scalar_one()
    balance = connection.execute(
        sa.text(
            "SELECT coalesce(sum(amount), 0) FROM ledger_entries "
            "WHERE account_id = :id AND entry_hash IS NOT NULL"
        ),
        {"id": account_id},
    ).scalar_one()
    after = 0
    while True:
        rows = connection.execute(
            sa.text(
                "SELECT id, account_id, kind, amount, generation_id, idempotency_key, created_at "
                "FROM ledger_entries WHERE account_id = :id AND id > :after "
                "AND entry_hash IS NULL ORDER BY id LIMIT :page"
            ),
            {"id": account_id, "after": after, "page": PAGE},
        ).all()
        if not rows:
            break
        chained = []
        for row in rows:
            balance += row.amount
            digest = _digest(row, balance, head)
            chained.append({"id": row.id, "balance": balance, "previous": head, "digest": digest})
            head = digest
        connection.execute(
            sa.text(
                "UPDATE ledger_entries SET balance_after = :balance, previous_hash = :previous, "
                "entry_hash = :digest WHERE id = :id"
            ),
            chained,
        )
        after = rows[-1].id
    connection.execute(
        sa.text("UPDATE accounts SET ledger_head = :head WHERE id = :id"),
        {"head": head, "id": account_id},
    )


def downgrade():
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            f"""
            CREATE OR REPLACE FUNCTION ledger_entries_append_only() RETURNS trigger AS $$
            BEGIN
                RAISE EXCEPTION '{MESSAGE}';
            END;
            $$ LANGUAGE plpgsql
            """
        )
    else:
        op.execute("DROP TRIGGER ledger_entries_no_update")
        op.execute(
            "CREATE TRIGGER ledger_entries_no_update BEFORE UPDATE ON ledger_entries "
            f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        )
    # ALTER TABLE ... DROP COLUMN in place, on both databases (SQLite 3.35 and later):
    # a batch copy would drop and recreate accounts, which the foreign keys that point at
    # it refuse, and ledger_entries, losing its append-only triggers.
    for table, column in (
        ("ledger_entries", "entry_hash"),
        ("ledger_entries", "previous_hash"),
        ("ledger_entries", "balance_after"),
        ("accounts", "ledger_head"),
    ):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
