"""an Idempotency-Key's claim names the generation that runs it

A retry whose first request's worker died asks the claim's generation whether it holds
credit or was charged, instead of taking the key over once a TTL has passed: a charge
whose answer was lost with its worker is never run and charged a second time. The
generation's hold carries the same id. Claims made before this revision name none.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 18:00:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("idempotent_requests") as batch:
        batch.add_column(sa.Column("generation_id", sa.String(length=64), nullable=True))


def downgrade():
    with op.batch_alter_table("idempotent_requests") as batch:
        batch.drop_column("generation_id")
