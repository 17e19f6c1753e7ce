"""a key's limit notes whether an owner, an admin or the operator set it

A member may lower such a limit but not raise or remove it, nor move it to another
window; a limit the member set themselves stays theirs to change. Who set the limits
already in place is not known: each is taken as set by an owner or admin, so that no
member can lift one they may not have set (an owner or admin can change it as before).

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-29 04:00:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade():
    op.add_column(
        "api_keys",
        sa.Column("budget_locked", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.execute("UPDATE api_keys SET budget_locked = (budget IS NOT NULL)")


def downgrade():
    op.drop_column("api_keys", "budget_locked")
