"""every key's row counts its month's spend, not only a limited key's

Holds and charges are now kept on every key's row. Before, an unlimited key's row was
left at zero; its spend this month is taken from its generations here, so that a limit
put on it later counts what it already spent. Requests that were running when this ran
were held without their key and are not on its row.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22 17:00:00

"""
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade():
    now = datetime.now(UTC)
    since = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0, tzinfo=None)
    op.get_bind().execute(
        sa.text(
            "UPDATE api_keys SET spend_month = :month, month_spent = COALESCE(("
            "SELECT SUM(generations.cost) FROM generations "
            "WHERE generations.api_key_id = api_keys.id AND generations.created_at >= :since"
            "), 0) WHERE monthly_limit IS NULL"
        ).bindparams(sa.bindparam("since", since, type_=sa.DateTime())),
        {"month": now.year * 100 + now.month},
    )


def downgrade():
    # Nothing to undo: an unlimited key's spend was never read before this revision.
    pass
