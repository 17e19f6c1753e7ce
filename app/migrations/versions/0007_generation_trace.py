"""generations record their request id, time to first token and upstream calls

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22 16:00:00

"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("generations") as batch:
        batch.add_column(sa.Column("request_id", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("time_to_first_token_ms", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("upstream_attempts", sa.JSON(), nullable=True))
        batch.create_index("ix_generations_request_id", ["request_id"])


def downgrade():
    with op.batch_alter_table("generations") as batch:
        batch.drop_index("ix_generations_request_id")
        batch.drop_column("upstream_attempts")
        batch.drop_column("time_to_first_token_ms")
        batch.drop_column("request_id")
