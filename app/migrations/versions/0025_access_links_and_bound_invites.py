"""access: password links, pending sign-ups, invites bound to an address, webhook userinfo

A password is now set only through a one-time ``password_links`` row (issued by the
operator, or mailed to the address), or at sign-up; with mail set up, a sign-up waits in
``pending_signups`` until its address is confirmed. An organisation's invite names the
address it was sent to (``email``, filled from the person it named), the member who made
it (``inviter_id``; None for the operator's and for every invite made before, which were
all the operator's or their inviter's is unknown) and when it was revoked; it no longer
names a person, so inviting an unknown address makes nobody.

A webhook URL's ``user:password@`` moves out of ``alert_endpoints.target`` into
``sealed_userinfo``, sealed like the signing secret (under SECRET_KEY), and the changes
log's copies of such URLs lose it.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-29 04:00:00

"""

from urllib.parse import urlsplit, urlunsplit

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade():
    create_password_links()
    create_pending_signups()
    bind_invites_to_addresses()
    seal_webhook_userinfo()


def create_password_links():
    op.create_table(
        "password_links",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("person_id", sa.Integer(), nullable=False),
        sa.Column("token_digest", sa.String(length=64), nullable=False),
        sa.Column("purpose", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("used_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["person_id"],
            ["people.id"],
            name=op.f("fk_password_links_person_id_people"),
            ondelete="CASCADE",
        ),  # fmt: skip
        sa.PrimaryKeyConstraint("id", name=op.f("pk_password_links")),
        sa.UniqueConstraint("token_digest", name=op.f("uq_password_links_token_digest")),
    )
    op.create_index(op.f("ix_password_links_person_id"), "password_links", ["person_id"])


def create_pending_signups():
    op.create_table(
        "pending_signups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=False),
        sa.Column("token_digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("used_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pending_signups")),
        sa.UniqueConstraint("token_digest", name=op.f("uq_pending_signups_token_digest")),
    )


def bind_invites_to_addresses():
    with op.batch_alter_table("account_invites") as batch:
        batch.add_column(sa.Column("email", sa.String(length=320), nullable=True))
        batch.add_column(sa.Column("inviter_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("revoked_at", sa.DateTime(), nullable=True))
    op.execute(
        "UPDATE account_invites SET email = "
        "(SELECT people.email FROM people WHERE people.id = account_invites.person_id)"
    )
    with op.batch_alter_table("account_invites") as batch:
        batch.alter_column("email", existing_type=sa.String(length=320), nullable=False)
        batch.drop_constraint("fk_account_invites_person_id_people", type_="foreignkey")
        batch.drop_column("person_id")
        batch.create_foreign_key(
            batch.f("fk_account_invites_inviter_id_people"),
            "people", ["inviter_id"], ["id"], ondelete="SET NULL",
        )  # fmt: skip


def seal_webhook_userinfo():
    from app.alerts.secrets import seal

    op.add_column("alert_endpoints", sa.Column("sealed_userinfo", sa.Text(), nullable=True))
    bind = op.get_bind()
    endpoints = bind.execute(
        sa.text("SELECT id, target FROM alert_endpoints WHERE kind = 'webhook'")
    ).all()
    for endpoint_id, target in endpoints:
        bare, userinfo = _split_userinfo(target)
        if userinfo:
            bind.execute(
                sa.text(
                    "UPDATE alert_endpoints SET target = :target, sealed_userinfo = :sealed "
                    "WHERE id = :id"
                ),
                {"target": bare, "sealed": seal(userinfo), "id": endpoint_id},
            )
    _scrub_changes(bind)


def _scrub_changes(bind):
    changes = sa.table("changes", sa.column("id", sa.Integer()), sa.column("detail", sa.JSON()))
    rows = bind.execute(
        sa.select(changes.c.id, changes.c.detail).where(sa.text("action = 'alerts.webhook.add'"))
    ).all()
    for change_id, detail in rows:
        target = (detail or {}).get("target")
        if target and _split_userinfo(target)[1]:
            masked = {**detail, "target": _mask(target)}
            bind.execute(changes.update().where(changes.c.id == change_id).values(detail=masked))


def _split_userinfo(url):
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, None
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), userinfo


def _mask(url):
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, "***@" + host, parts.path, parts.query, parts.fragment))


def downgrade():
    op.drop_column("alert_endpoints", "sealed_userinfo")
    with op.batch_alter_table("account_invites") as batch:
        batch.drop_constraint("fk_account_invites_inviter_id_people", type_="foreignkey")
        batch.drop_column("revoked_at")
        batch.drop_column("inviter_id")
        batch.add_column(sa.Column("person_id", sa.Integer(), nullable=True))
    op.execute(
        "UPDATE account_invites SET person_id = "
        "(SELECT people.id FROM people WHERE people.email = account_invites.email)"
    )
    op.execute("DELETE FROM account_invites WHERE person_id IS NULL")
    with op.batch_alter_table("account_invites") as batch:
        batch.alter_column("person_id", existing_type=sa.Integer(), nullable=False)
        batch.drop_column("email")
        batch.create_foreign_key(
            batch.f("fk_account_invites_person_id_people"),
            "people", ["person_id"], ["id"], ondelete="CASCADE",
        )  # fmt: skip
    op.drop_table("pending_signups")
    op.drop_index(op.f("ix_password_links_person_id"), table_name="password_links")
    op.drop_table("password_links")
