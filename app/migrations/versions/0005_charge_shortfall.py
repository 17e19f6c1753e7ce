"""generations record the part of their price that could not be charged

A generation whose actual usage prices above its hold is charged what the balance and
the key's monthly limit allow; the rest is its shortfall, kept on its record so that
the audit tells it from a pricing mismatch.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 16:30:00

"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("generations") as batch:
        batch.add_column(
            sa.Column("shortfall", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade():
    with op.batch_alter_table("generations") as batch:
        batch.drop_column("shortfall")
