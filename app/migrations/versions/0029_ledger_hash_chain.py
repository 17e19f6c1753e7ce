"""ledger entries are hash-chained per account; the account keeps the chain's head

Each entry gets the balance it left, the digest of the account's entry before it and
its own (app.credits.chain, docs/concepts/ledger-chain.md); each account the digest of
its last entry, ``ledger_head``. The entries already there are chained here, in the
order of their ids, one account at a time in a transaction of its own, its row locked
meanwhile (the app's writes to other accounts go on), its entries written a page at a
time.

The append-only triggers let an entry not yet chained be chained, once: its chain's
columns written, none of its own changed. Everything else is still refused.

The previous release goes on writing while this runs and until its processes stop, and
knows nothing of the chain. On PostgreSQL (SQLite is served by one process, restarted
on the new code) two triggers chain what it writes, so that nothing is left unchained:
an entry inserted without its chain's columns locks its account's row, is given its id
only then (an account's entries are chained in the order of their ids), and is chained
after the account's last entry, unless that one is not chained yet (the loop below
chains both, in order); after the statement (the previous release's settlement changes
the account's row in the same statement), the account's head moves to it. The app never
inserts such an entry, so neither trigger fires for it; a later revision may drop them.

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
    if op.get_context().dialect.name == "postgresql":
        _chain_what_the_previous_release_writes()
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


def _sql_text_field(name):
    return f"CASE WHEN NEW.{name} IS NULL THEN '-' ELSE length(NEW.{name}) || ':' || NEW.{name} END"


def _chain_what_the_previous_release_writes():
    """Chain, on PostgreSQL, each entry inserted without its chain's columns (see above)."""
    canonical = " || '|' || ".join(
        (
            "'ledger-v1'",
            "NEW.id",
            "NEW.account_id",
            "NEW.kind",
            "NEW.amount",
            "NEW.balance_after",
            _sql_text_field("generation_id"),
            _sql_text_field("idempotency_key"),
            "(extract(epoch FROM NEW.created_at) * 1000000)::bigint",
            "NEW.previous_hash",
        )
    )
    op.execute(
        f"""
        CREATE FUNCTION ledger_entries_chain_unchained() RETURNS trigger AS $$
        DECLARE
            last_hash text;
            last_balance bigint;
        BEGIN
            PERFORM 1 FROM accounts WHERE id = NEW.account_id FOR UPDATE;
            NEW.id := nextval(pg_get_serial_sequence('ledger_entries', 'id'));
            SELECT entry_hash, balance_after INTO last_hash, last_balance
                FROM ledger_entries WHERE account_id = NEW.account_id
                ORDER BY id DESC LIMIT 1;
            IF FOUND AND last_hash IS NULL THEN
                RETURN NEW;
            END IF;
            NEW.previous_hash := coalesce(last_hash, '{GENESIS}');
            NEW.balance_after := coalesce(last_balance, 0) + NEW.amount;
            NEW.entry_hash := encode(sha256(convert_to({canonical}, 'UTF8')), 'hex');
            PERFORM set_config('ledger.chained_late', 'on', true);
            RETURN NEW;
        END;
        $$ LANGUAGE plpgsql
        """
    )
    op.execute(
        "CREATE TRIGGER ledger_entries_chain_unchained BEFORE INSERT ON ledger_entries "
        "FOR EACH ROW WHEN (NEW.entry_hash IS NULL) "
        "EXECUTE FUNCTION ledger_entries_chain_unchained()"
    )
    op.execute(
        """
        CREATE FUNCTION ledger_entries_head_late() RETURNS trigger AS $$
        BEGIN
            UPDATE accounts SET ledger_head = NEW.entry_hash WHERE id = NEW.account_id;
            RETURN NULL;
        END;
        $$ LANGUAGE plpgsql
        """
    )
    op.execute(
        "CREATE TRIGGER ledger_entries_head_late AFTER INSERT ON ledger_entries "
        "FOR EACH ROW WHEN (NEW.entry_hash IS NOT NULL "
        "AND current_setting('ledger.chained_late', true) = 'on') "
        "EXECUTE FUNCTION ledger_entries_head_late()"
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
        for name in ("ledger_entries_chain_unchained", "ledger_entries_head_late"):
            op.execute(f"DROP TRIGGER {name} ON ledger_entries")
            op.execute(f"DROP FUNCTION {name}()")
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
