"""budgets: a key's monthly limit becomes a budget in a window; members get budgets too

A key's ``monthly_limit``, ``month_spent`` and ``month_reserved`` become ``budget``,
``window_spent`` and ``window_reserved`` in a ``budget_window`` (``month`` for every key
made before), and ``spend_month`` (``YYYYMM``) becomes ``window_start``, the window's
first instant in Unix microseconds: a key that last spent in an earlier month starts this
month at zero, as its next hold would have. Memberships get the same columns. Holds
note the windows their key and member counted them in; every hold placed this
month counts in the current month's window, as it was counted in the month's spend.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-26 22:20:00

"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def budget_columns():
    return [
        sa.Column("budget", sa.BigInteger(), nullable=True),
        sa.Column("budget_window", sa.String(length=8), nullable=False, server_default="month"),
        sa.Column("window_start", sa.BigInteger(), nullable=True),
        sa.Column("window_spent", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("window_reserved", sa.BigInteger(), nullable=False, server_default="0"),
    ]


def this_month(now: datetime) -> tuple[int, int]:
    """Return the current month as ``YYYYMM`` and its first instant in Unix microseconds."""
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return now.year * 100 + now.month, int(start.timestamp()) * 1_000_000


def upgrade():
    month, start = this_month(datetime.now(UTC))
    for old, new in (
        ("monthly_limit", "budget"),
        ("month_spent", "window_spent"),
        ("month_reserved", "window_reserved"),
    ):
        op.execute(f"ALTER TABLE api_keys RENAME COLUMN {old} TO {new}")
    op.add_column(
        "api_keys",
        sa.Column("budget_window", sa.String(length=8), nullable=False, server_default="month"),
    )
    op.add_column("api_keys", sa.Column("window_start", sa.BigInteger(), nullable=True))
    op.execute(
        sa.text(
            "UPDATE api_keys SET window_start = :start, window_spent = "
            "CASE WHEN spend_month = :month THEN window_spent ELSE 0 END"
        ).bindparams(start=start, month=month)
    )
    op.execute("ALTER TABLE api_keys DROP COLUMN spend_month")
    for column in budget_columns():
        op.add_column("memberships", column)
    op.execute(sa.text("UPDATE memberships SET window_start = :start").bindparams(start=start))
    # Every key's spend this month counts against its member: the member's counters start
    # as the sums of their keys'.
    for counter in ("window_spent", "window_reserved"):
        op.execute(
            f"UPDATE memberships SET {counter} = COALESCE((SELECT SUM(api_keys.{counter}) "
            "FROM api_keys WHERE api_keys.member_id = memberships.id), 0)"
        )
    op.add_column("holds", sa.Column("key_window_start", sa.BigInteger(), nullable=True))
    op.add_column("holds", sa.Column("member_window_start", sa.BigInteger(), nullable=True))
    # Every hold placed this month was counted in the month's spend (or reservation).
    op.execute(
        sa.text(
            "UPDATE holds SET key_window_start = :start, member_window_start = :start "
            "WHERE api_key_id IS NOT NULL AND created_at >= :since"
        ).bindparams(
            sa.bindparam("since", type_=sa.DateTime()),
            start=start,
            since=datetime.fromtimestamp(start // 1_000_000, UTC).replace(tzinfo=None),
        )
    )


def downgrade():
    month, start = this_month(datetime.now(UTC))
    op.drop_column("holds", "member_window_start")
    op.drop_column("holds", "key_window_start")
    for column in reversed(budget_columns()):
        op.drop_column("memberships", column.name)
    op.add_column("api_keys", sa.Column("spend_month", sa.Integer(), nullable=True))
    op.execute(
        sa.text(
            "UPDATE api_keys SET spend_month = :month, window_spent = "
            "CASE WHEN window_start >= :start THEN window_spent ELSE 0 END"
        ).bindparams(month=month, start=start)
    )
    op.drop_column("api_keys", "window_start")
    op.drop_column("api_keys", "budget_window")
    for old, new in (
        ("monthly_limit", "budget"),
        ("month_spent", "window_spent"),
        ("month_reserved", "window_reserved"),
    ):
        op.execute(f"ALTER TABLE api_keys RENAME COLUMN {new} TO {old}")
