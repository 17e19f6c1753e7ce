"""stored Responses API responses, for previous_response_id, retrieval and deletion

A response created with ``store`` (OpenAI's default) keeps its input items and the
Response object it answered with, for its account, until ``expires_at``
(RESPONSES_TTL_DAYS after it was created), when the sweeper deletes it. Each row names
the response it continued and how long its chain is, and how many bytes the chain
holds, so that a continuation is bounded before anything of the chain is read.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 20:30:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "stored_responses",
        sa.Column("id", sa.String(length=64), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("previous_response_id", sa.String(length=64), nullable=True),
        sa.Column("chain_length", sa.Integer(), nullable=False),
        sa.Column("chain_bytes", sa.BigInteger(), nullable=False),
        sa.Column("input_items", sa.LargeBinary(), nullable=False),
        sa.Column("response", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_stored_responses_expires_at", "stored_responses", ["expires_at"])


def downgrade():
    op.drop_index("ix_stored_responses_expires_at", table_name="stored_responses")
    op.drop_table("stored_responses")
