"""fewer index entries written per hold and charge

Every billed request inserts a hold and marks it settled, and writes each of its
indexes; SQLite appends every page they touch to its WAL, twice a request.

- holds: the sweeper and the open-holds gauge look for open holds, a handful among
  every hold ever placed. A partial index of the open ones' expiry replaces the index
  on (status, expires_at), which moved each hold's entry from the open to the settled
  part of a large index. The index on account_id goes: no query looks a holds row up
  by its account but among the open ones, and accounts are never deleted.
- generations: nothing looks a generation up by its request id, which its record
  keeps and /v1/generations/{id} shows.

On PostgreSQL the indexes are built and dropped concurrently, without locking writes
to tables as large as every request made them.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 01:00:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

OPEN = sa.text("status = 'open'")


def upgrade():
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_holds_open_expires_at",
            "holds",
            ["expires_at"],
            sqlite_where=OPEN,
            postgresql_where=OPEN,
            postgresql_concurrently=True,
        )
        op.drop_index("ix_holds_status_expires_at", "holds", postgresql_concurrently=True)
        op.drop_index("ix_holds_account_id", "holds", postgresql_concurrently=True)
        op.drop_index("ix_generations_request_id", "generations", postgresql_concurrently=True)


def downgrade():
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_generations_request_id", "generations", ["request_id"], postgresql_concurrently=True
        )
        op.create_index(
            "ix_holds_account_id", "holds", ["account_id"], postgresql_concurrently=True
        )
        op.create_index(
            "ix_holds_status_expires_at",
            "holds",
            ["status", "expires_at"],
            postgresql_concurrently=True,
        )
        op.drop_index("ix_holds_open_expires_at", "holds", postgresql_concurrently=True)
