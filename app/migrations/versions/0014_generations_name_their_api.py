"""a generation records the front door it came in by, and its prompt-cache writes

Chat Completions, OpenAI's Responses API and Anthropic's Messages API are served on
the same generation core; the dashboard, the CSV and the metrics say which API each
generation came through. Every generation recorded before came through Chat
Completions. Prompt tokens an upstream wrote to its prompt cache (Anthropic's
cache_creation_input_tokens) are priced at the catalog's cache_write price, recorded
with the generation so that the audit can re-price it; none were counted before.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 20:00:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("generations") as batch:
        batch.add_column(
            sa.Column("api", sa.String(length=16), nullable=False, server_default="chat")
        )
        batch.add_column(
            sa.Column("cache_write_tokens", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("price_cache_write", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade():
    with op.batch_alter_table("generations") as batch:
        batch.drop_column("price_cache_write")
        batch.drop_column("cache_write_tokens")
        batch.drop_column("api")
