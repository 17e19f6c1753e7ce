"""payments: Stripe orders and the events applied to them, redemption codes; debt allowed

``payment_orders`` holds the credits an organisation buys and how far each got;
``stripe_events`` each Stripe event applied, once (its id is the key); and
``redemption_codes`` the codes an operator hands out, kept as digests; ``auto_topups``
each organisation's saved card, threshold and amount for off-session top-ups, of which
one at a time may be pending (a partial unique index).

A refund or a dispute takes back credits that may have been spent already: the balance
may then go below zero (the organisation is in debt until it pays it back), so the CHECK
``balance >= 0`` goes. ``balance - reserved >= amount`` still keeps every hold within
what is there. On SQLite the CHECK is removed from the table's definition in place, as
SQLite documents for removing a CHECK constraint (writable_schema), which keeps the
table, its triggers and the foreign keys that name it as they are.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-29 08:00:00

"""

import re

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

_BALANCE_CHECK = "ck_accounts_balance_not_negative"
_CHECK_CLAUSE = re.compile(r",\s*CONSTRAINT ck_accounts_balance_not_negative CHECK \(balance >= 0\)")


def upgrade():
    op.create_table(
        "payment_orders",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("fee", sa.BigInteger(), nullable=False),
        sa.Column("total_cents", sa.Integer(), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("checkout_session_id", sa.String(255), unique=True),
        sa.Column("payment_intent_id", sa.String(255), unique=True),
        sa.Column("receipt_url", sa.String(1000)),
        sa.Column("refunded_cents", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("taken_back", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("dispute", sa.String(16)),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("paid_at", sa.DateTime()),
        sa.CheckConstraint("total_cents > 0", name="total_positive"),
    )
    op.create_index(
        "ix_payment_orders_account_id_created_at", "payment_orders", ["account_id", "created_at"]
    )
    op.create_table(
        "stripe_events",
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("order_id", sa.String(40)),
        sa.Column("received_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "redemption_codes",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime()),
        sa.Column("redeemed_by", sa.Integer(), sa.ForeignKey("accounts.id")),
        sa.Column("redeemed_at", sa.DateTime()),
    )
    # One auto top-up in flight per organisation: whichever workers see the crossing.
    op.create_index(
        "uq_payment_orders_auto_topup_pending",
        "payment_orders",
        ["account_id"],
        unique=True,
        sqlite_where=sa.text("kind = 'auto_topup' AND status = 'pending'"),
        postgresql_where=sa.text("kind = 'auto_topup' AND status = 'pending'"),
    )
    op.create_table(
        "auto_topups",
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), primary_key=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("threshold", sa.BigInteger()),
        sa.Column("amount", sa.BigInteger()),
        sa.Column("customer_id", sa.String(255)),
        sa.Column("payment_method_id", sa.String(255)),
        sa.Column("armed", sa.Boolean(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(op.f(_BALANCE_CHECK), "accounts", type_="check")
    else:
        _rewrite_sqlite_accounts(lambda sql: _CHECK_CLAUSE.sub("", sql))


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.create_check_constraint(op.f(_BALANCE_CHECK), "accounts", "balance >= 0")
    else:
        _rewrite_sqlite_accounts(
            lambda sql: sql.rstrip().removesuffix(")").rstrip()
            + f", \n\tCONSTRAINT {_BALANCE_CHECK} CHECK (balance >= 0)\n)"
        )
    op.drop_table("auto_topups")
    op.drop_index("uq_payment_orders_auto_topup_pending", "payment_orders")
    op.drop_table("redemption_codes")
    op.drop_table("stripe_events")
    op.drop_index("ix_payment_orders_account_id_created_at", "payment_orders")
    op.drop_table("payment_orders")


def _rewrite_sqlite_accounts(rewrite):
    """Replace the accounts table's definition with ``rewrite(definition)``, in place."""
    bind = op.get_bind()
    sql = bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'accounts'"
    ).scalar_one()
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    bind.exec_driver_sql(
        "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'accounts'",
        (rewrite(sql),),
    )
    # The new schema version makes every connection read the definition again.
    bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    bind.exec_driver_sql("PRAGMA writable_schema = OFF")
