"""dashboard sign-in: account passwords and invites

Passwords and invites live in tables of their own rather than columns of accounts, so
the accounts table, which the hot path updates on every request, is left as it was.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 16:00:00

"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "account_passwords",
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_account_passwords_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_account_passwords")),
    )
    op.create_table(
        "account_invites",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("token_digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("used_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_account_invites_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_account_invites")),
        sa.UniqueConstraint("token_digest", name=op.f("uq_account_invites_token_digest")),
    )
    op.create_index(
        op.f("ix_account_invites_account_id"), "account_invites", ["account_id"], unique=False
    )


def downgrade():
    op.drop_index(op.f("ix_account_invites_account_id"), table_name="account_invites")
    op.drop_table("account_invites")
    op.drop_table("account_passwords")
