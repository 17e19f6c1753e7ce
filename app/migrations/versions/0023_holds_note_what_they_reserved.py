"""holds note whether they reserved on their key's row and on its member's

A hold reserves on its key's and its member's rows only where that row has a budget
(or a rolling window, which holds start): a reservation on a row without a budget
protects nothing, and writing the row on every hold was half of its writes. Each hold
notes what it reserved, so that its settlement, its release and the sweeper's expiry
give back exactly that. Every hold placed before reserved on both.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 10:00:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

COLUMNS = ("reserved_on_key", "reserved_on_member")


def upgrade():
    for name in COLUMNS:
        op.add_column(
            "holds", sa.Column(name, sa.Boolean(), nullable=False, server_default=sa.true())
        )


def downgrade():
    # The counters of rows without a budget would miss their open holds' reservations:
    # put them back on, as every hold reserved before.
    for table, column, key_of in (
        ("api_keys", "reserved_on_key", "api_keys.id"),
        ("memberships", "reserved_on_member", "memberships.id"),
    ):
        owner = (
            "holds.api_key_id"
            if table == "api_keys"
            else ("(SELECT api_keys.member_id FROM api_keys WHERE api_keys.id = holds.api_key_id)")
        )
        op.execute(
            f"UPDATE {table} SET window_reserved = window_reserved + COALESCE(("
            f"SELECT SUM(holds.amount) FROM holds WHERE {owner} = {key_of}"
            f" AND holds.status = 'open' AND NOT holds.{column}), 0)"
        )
    for name in reversed(COLUMNS):
        op.drop_column("holds", name)
