"""a generation records every line its upstream bills: 1-hour cache writes, tool calls, tier

Anthropic's prompt-cache writes with a 1-hour TTL cost more than the 5-minute ones;
hosted and server tools (web search, code execution, ...) are billed per call; a service
tier (priority) multiplies every price. Each generation records, with the prices it was
charged at, its 1-hour cache writes (part of cache_write_tokens) and their price, the
tool calls the upstream reported with each tool's price per call, and the tier it was
served in with that tier's multiplier, so that the audit can re-price it. Every earlier
generation wrote no 1-hour entries, called no priced tool and was priced at 1.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29 04:00:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

# A multiplier of 1, in the money units (1e-10) the column stores.
ONE = str(10**10)


def upgrade():
    with op.batch_alter_table("generations") as batch:
        batch.add_column(
            sa.Column("cache_write_1h_tokens", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("price_cache_write_1h", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("tool_calls", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("service_tier", sa.String(length=32), nullable=True))
        batch.add_column(
            sa.Column("tier_multiplier", sa.BigInteger(), nullable=False, server_default=ONE)
        )


def downgrade():
    with op.batch_alter_table("generations") as batch:
        batch.drop_column("tier_multiplier")
        batch.drop_column("service_tier")
        batch.drop_column("tool_calls")
        batch.drop_column("price_cache_write_1h")
        batch.drop_column("cache_write_1h_tokens")
