"""usage totals per account, key, model and UTC hour, written with every charge

History is read from one row an hour per account, key and model instead of every
generation ever recorded: the dashboard's totals and chart, a key's spend this month
and today. Every settlement adds its request, tokens, charge and shortfall to its row
in its own transaction; the rows are filled here from the generations recorded so far.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26 21:00:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

SUMS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost",
    "shortfall",
)


def upgrade():
    op.create_table(
        "usage_rollups",
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("api_key_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("hour", sa.DateTime(), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in SUMS),
        sa.PrimaryKeyConstraint("account_id", "api_key_id", "model", "hour"),
    )
    hour = (
        "date_trunc('hour', created_at)"
        if op.get_bind().dialect.name == "postgresql"
        else "strftime('%Y-%m-%d %H:00:00.000000', created_at)"
    )
    op.execute(
        f"""
        INSERT INTO usage_rollups (account_id, api_key_id, model, hour, {", ".join(SUMS)})
        SELECT account_id, COALESCE(api_key_id, 0), model, {hour}, count(*),
               sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens),
               sum(reasoning_tokens), sum(cost), sum(shortfall)
        FROM generations
        GROUP BY account_id, COALESCE(api_key_id, 0), model, {hour}
        """
    )


def downgrade():
    op.drop_table("usage_rollups")
