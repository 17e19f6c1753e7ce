"""a stream's hold keeps what the stream delivered, to bill it if its worker dies

Each worker records, about once a second, the usage of every stream it is running that
delivered text since (one UPDATE for all of them). A hold that expires with progress
recorded is settled at it, as an interrupted generation whose usage is estimated,
rather than released: what a caller received is billed even when the worker was killed.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 19:00:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("holds") as batch:
        batch.add_column(sa.Column("progress", sa.JSON(), nullable=True))


def downgrade():
    with op.batch_alter_table("holds") as batch:
        batch.drop_column("progress")
