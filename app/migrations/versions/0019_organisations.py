"""organisations: people sign in, and belong to organisations with a role

An account becomes an organisation: it keeps its balance, ledger, holds, generations,
rollups and keys, and gains a name. Whoever signs in is now a person (``people``), who
holds the password (moved from ``account_passwords``) and the operator flag (moved from
``accounts.is_admin``), and belongs to organisations through ``memberships``. Every
account's holder becomes a person WITH THE ACCOUNT'S id, so the dashboard sessions that
name it stay valid, and the owner of their account; every key becomes their owner's
(``api_keys.member_id``). Invites name the person and the role they are for. ``changes``
is the organisations' audit log.

On SQLite, changing a column rebuilds its table, and dropping the old table would cascade
to the tables that refer to it (deleting keys, clearing the generations' keys): foreign
keys are switched off meanwhile, which SQLite only allows outside a transaction, and
checked before they are switched back on.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-26 22:00:00

"""

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


@contextmanager
def sqlite_foreign_keys_off() -> Iterator[None]:
    """On SQLite, run the body with foreign keys off (and committed); elsewhere just run it."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        yield
        return
    dbapi = bind.connection.dbapi_connection
    dbapi.commit()  # SQLite ignores the pragma inside a transaction
    dbapi.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
        broken = dbapi.execute("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"foreign keys broken by the migration: {broken[:5]}")
    finally:
        dbapi.commit()
        dbapi.execute("PRAGMA foreign_keys=ON")


def upgrade():
    with sqlite_foreign_keys_off():
        create_people_and_memberships()
        move_sign_in_to_people()
        give_keys_their_members()
        give_invites_their_people()
        create_changes()


def create_people_and_memberships():
    op.create_table(
        "people",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_people")),
        sa.UniqueConstraint("email", name=op.f("uq_people_email")),
    )
    op.create_table(
        "memberships",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("person_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("removed_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"],
            name=op.f("fk_memberships_account_id_accounts"), ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["person_id"], ["people.id"],
            name=op.f("fk_memberships_person_id_people"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memberships")),
        sa.UniqueConstraint(
            "account_id", "person_id", name=op.f("uq_memberships_account_id_person_id")
        ),
    )  # fmt: skip
    op.create_index(op.f("ix_memberships_person_id"), "memberships", ["person_id"])
    op.execute(
        "INSERT INTO people (id, email, password_hash, created_at, is_admin) "
        "SELECT accounts.id, accounts.email, account_passwords.password_hash, "
        "accounts.created_at, accounts.is_admin FROM accounts "
        "LEFT JOIN account_passwords ON account_passwords.account_id = accounts.id"
    )
    if op.get_bind().dialect.name == "postgresql":
        # People were inserted with their ids: the next person must not take one.
        op.execute(
            "SELECT setval(pg_get_serial_sequence('people', 'id'), "
            "COALESCE((SELECT max(id) FROM people), 0) + 1, false)"
        )
    op.execute(
        "INSERT INTO memberships (account_id, person_id, role, created_at) "
        "SELECT id, id, 'owner', created_at FROM accounts"
    )


def move_sign_in_to_people():
    with op.batch_alter_table("accounts") as batch:
        batch.add_column(sa.Column("name", sa.String(length=200), nullable=True))
    op.execute("UPDATE accounts SET name = email")
    with op.batch_alter_table("accounts") as batch:
        batch.alter_column("name", existing_type=sa.String(length=200), nullable=False)
        batch.alter_column("email", existing_type=sa.String(length=320), nullable=True)
        batch.drop_column("is_admin")
    op.drop_table("account_passwords")


def give_keys_their_members():
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("member_id", sa.Integer(), nullable=True))
    op.execute(
        "UPDATE api_keys SET member_id = (SELECT memberships.id FROM memberships "
        "WHERE memberships.account_id = api_keys.account_id AND memberships.role = 'owner')"
    )
    with op.batch_alter_table("api_keys") as batch:
        batch.alter_column("member_id", existing_type=sa.Integer(), nullable=False)
        batch.create_foreign_key(
            batch.f("fk_api_keys_member_id_memberships"), "memberships", ["member_id"], ["id"]
        )
        batch.create_index(batch.f("ix_api_keys_member_id"), ["member_id"])


def give_invites_their_people():
    with op.batch_alter_table("account_invites") as batch:
        batch.add_column(sa.Column("person_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("role", sa.String(length=16), nullable=True))
    # An invite so far was for an account's holder, to set their password.
    op.execute("UPDATE account_invites SET person_id = account_id, role = 'owner'")
    with op.batch_alter_table("account_invites") as batch:
        batch.alter_column("person_id", existing_type=sa.Integer(), nullable=False)
        batch.alter_column("role", existing_type=sa.String(length=16), nullable=False)
        batch.create_foreign_key(
            batch.f("fk_account_invites_person_id_people"),
            "people", ["person_id"], ["id"], ondelete="CASCADE",
        )  # fmt: skip


def create_changes():
    op.create_table(
        "changes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("actor_id", sa.Integer(), nullable=True),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=100), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"],
            name=op.f("fk_changes_account_id_accounts"), ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["actor_id"], ["people.id"],
            name=op.f("fk_changes_actor_id_people"), ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_changes")),
    )  # fmt: skip
    op.create_index("ix_changes_account_id_id", "changes", ["account_id", "id"])


def downgrade():
    """Back to one holder per account: each account's owner signs in to it.

    Organisations made since, and the people who are no account's owner, lose their
    sign-in (people whose id is no account's id cannot be mapped back).
    """
    with sqlite_foreign_keys_off():
        op.drop_index("ix_changes_account_id_id", table_name="changes")
        op.drop_table("changes")
        with op.batch_alter_table("account_invites") as batch:
            batch.drop_constraint("fk_account_invites_person_id_people", type_="foreignkey")
            batch.drop_column("role")
            batch.drop_column("person_id")
        with op.batch_alter_table("api_keys") as batch:
            batch.drop_index("ix_api_keys_member_id")
            batch.drop_constraint("fk_api_keys_member_id_memberships", type_="foreignkey")
            batch.drop_column("member_id")
        restore_account_sign_in()
        op.drop_index(op.f("ix_memberships_person_id"), table_name="memberships")
        op.drop_table("memberships")
        op.drop_table("people")


def restore_account_sign_in():
    op.create_table(
        "account_passwords",
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"],
            name=op.f("fk_account_passwords_account_id_accounts"), ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_account_passwords")),
    )  # fmt: skip
    op.execute(
        "INSERT INTO account_passwords (account_id, password_hash, updated_at) "
        "SELECT people.id, people.password_hash, people.created_at FROM people "
        "JOIN accounts ON accounts.id = people.id WHERE people.password_hash IS NOT NULL"
    )
    with op.batch_alter_table("accounts") as batch:
        batch.add_column(sa.Column("is_admin", sa.Boolean(), nullable=True))
    op.execute(
        "UPDATE accounts SET is_admin = COALESCE("
        "(SELECT people.is_admin FROM people WHERE people.id = accounts.id), false), "
        "email = COALESCE(email, 'organisation-' || id || '@invalid')"
    )
    with op.batch_alter_table("accounts") as batch:
        batch.alter_column("is_admin", existing_type=sa.Boolean(), nullable=False)
        batch.alter_column("email", existing_type=sa.String(length=320), nullable=False)
        batch.drop_column("name")
