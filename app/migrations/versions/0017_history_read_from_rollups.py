"""history read from rollups: their indexes, the ledger by account, audit checkpoints

The dashboard, the keys page and GET /v1/key read usage_rollups by account (or key)
and hour; the pruner finds the accounts with hours past the retention there. A
settlement only updates a rollup's sums, so these indexes are written once an hour per
row, not per request.

The ledger is read by account in id order (the balance page, and the audit's entries
since its last checkpoint): an index on (account_id, id) replaces the unique index on
(account_id, idempotency_key), which every charge wrote with a NULL key; a grant's key
stays unique among the entries that have one. An account's grants are indexed apart
(GET /v1/credits sums them): no charge writes that index.

audit_checkpoints keeps where each account's last clean audit stopped;
generation_retention, before when raw generations may have been pruned.

On PostgreSQL the indexes are built CONCURRENTLY (reads and writes go on); dropping the
old unique constraint takes ledger_entries' lock for a moment. On SQLite
ledger_entries is rebuilt (its append-only triggers with it).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 10:00:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

ROLLUP_INDEXES = {
    "ix_usage_rollups_account_id_hour": ["account_id", "hour"],
    "ix_usage_rollups_account_id_api_key_id_hour": ["account_id", "api_key_id", "hour"],
    "ix_usage_rollups_hour": ["hour"],
}
OLD_UNIQUE = "uq_ledger_entries_account_id_idempotency_key"
GRANT_KEY = "uq_ledger_entries_grant_idempotency_key"
BY_ACCOUNT = "ix_ledger_entries_account_id_id"
GRANTS = "ix_ledger_entries_grants"
HAS_KEY = sa.text("idempotency_key IS NOT NULL")
IS_GRANT = sa.text("kind = 'grant'")
APPEND_ONLY = "ledger entries are append-only"
RETENTION_ROW = 1


def upgrade():
    postgresql = op.get_bind().dialect.name == "postgresql"
    with op.get_context().autocommit_block():
        for name, columns in ROLLUP_INDEXES.items():
            op.create_index(name, "usage_rollups", columns, postgresql_concurrently=True)
    if postgresql:
        _ledger_indexes_on_postgresql()
    else:
        _ledger_indexes_on_sqlite()
    op.create_table(
        "audit_checkpoints",
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("ledger_entry_id", sa.Integer(), nullable=False),
        sa.Column("ledger_sum", sa.BigInteger(), nullable=False),
        sa.Column("checked_until", sa.DateTime(), nullable=False),
        sa.Column("checked_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_audit_checkpoints")),
    )
    retention = op.create_table(
        "generation_retention",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pruned_before", sa.DateTime(), nullable=True),
        sa.Column("swept_before", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_generation_retention")),
    )
    # Its one row, nothing pruned yet.
    op.bulk_insert(retention, [{"id": RETENTION_ROW}])


def _ledger_indexes_on_postgresql():
    with op.get_context().autocommit_block():
        op.create_index(
            GRANT_KEY,
            "ledger_entries",
            ["account_id", "idempotency_key"],
            unique=True,
            postgresql_where=HAS_KEY,
            postgresql_concurrently=True,
        )
        op.create_index(
            BY_ACCOUNT, "ledger_entries", ["account_id", "id"], postgresql_concurrently=True
        )
        op.create_index(
            GRANTS,
            "ledger_entries",
            ["account_id"],
            postgresql_where=IS_GRANT,
            postgresql_concurrently=True,
        )
    op.drop_constraint(OLD_UNIQUE, "ledger_entries", type_="unique")


def _ledger_indexes_on_sqlite():
    with op.batch_alter_table("ledger_entries", recreate="always") as batch:
        batch.drop_constraint(OLD_UNIQUE, type_="unique")
    op.create_index(
        GRANT_KEY,
        "ledger_entries",
        ["account_id", "idempotency_key"],
        unique=True,
        sqlite_where=HAS_KEY,
    )
    op.create_index(BY_ACCOUNT, "ledger_entries", ["account_id", "id"])
    op.create_index(GRANTS, "ledger_entries", ["account_id"], sqlite_where=IS_GRANT)
    _append_only_on_sqlite()


def _append_only_on_sqlite():
    """Refuse UPDATE and DELETE again: a rebuilt table has lost its triggers."""
    for action in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER IF NOT EXISTS ledger_entries_no_{action.lower()} "
            f"BEFORE {action} ON ledger_entries BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END"
        )


def downgrade():
    op.drop_table("generation_retention")
    op.drop_table("audit_checkpoints")
    op.drop_index(GRANTS, table_name="ledger_entries")
    op.drop_index(BY_ACCOUNT, table_name="ledger_entries")
    op.drop_index(GRANT_KEY, table_name="ledger_entries")
    if op.get_bind().dialect.name == "postgresql":
        op.create_unique_constraint(OLD_UNIQUE, "ledger_entries", ["account_id", "idempotency_key"])
    else:
        with op.batch_alter_table("ledger_entries", recreate="always") as batch:
            batch.create_unique_constraint(OLD_UNIQUE, ["account_id", "idempotency_key"])
        _append_only_on_sqlite()
    for name in ROLLUP_INDEXES:
        op.drop_index(name, table_name="usage_rollups")
