"""per-key limits: permitted models and a monthly spend limit

A key may be limited to some models and to a monthly spend. A limited key keeps its
month's spend and its open holds' reservation on its row, so the hold's conditional
UPDATE can refuse a request past the limit in the same transaction as the balance;
a hold remembers the key it reserved against, so that its expiry releases it.

Revision ID: credit_key_limits
Revises: 0003
Create Date: 2026-11-22 16:00:00

"""
import sqlalchemy as sa
from alembic import op

revision = "credit_key_limits"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("permitted_models", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("monthly_limit", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("spend_month", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("month_spent", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("month_reserved", sa.BigInteger(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("holds") as batch:
        batch.add_column(sa.Column("api_key_id", sa.Integer(), nullable=True))


def downgrade():
    with op.batch_alter_table("holds") as batch:
        batch.drop_column("api_key_id")
    with op.batch_alter_table("api_keys") as batch:
        for column in (
            "month_reserved",
            "month_spent",
            "spend_month",
            "monthly_limit",
            "permitted_models",
        ):
            batch.drop_column(column)
