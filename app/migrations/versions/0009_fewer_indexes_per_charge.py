"""fewer index entries written per charge

Every billed request inserts a ledger entry and a generation record, and writes each of
their indexes. ledger_entries' index on account_id repeated the first column of its
unique (account_id, idempotency_key) index, which serves the same lookups. Every query
of generations by time also names the account (or the key, which has its own index):
one index on (account_id, created_at) replaces the two on each column alone.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 04:00:00

"""
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade():
    op.drop_index("ix_ledger_entries_account_id", table_name="ledger_entries")
    op.create_index(
        "ix_generations_account_id_created_at", "generations", ["account_id", "created_at"]
    )
    op.drop_index("ix_generations_account_id", table_name="generations")
    op.drop_index("ix_generations_created_at", table_name="generations")


def downgrade():
    op.create_index("ix_generations_created_at", "generations", ["created_at"])
    op.create_index("ix_generations_account_id", "generations", ["account_id"])
    op.drop_index("ix_generations_account_id_created_at", table_name="generations")
    op.create_index("ix_ledger_entries_account_id", "ledger_entries", ["account_id"])
