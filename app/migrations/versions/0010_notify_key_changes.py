"""tell the gateway's processes when a key changes (PostgreSQL)

Each process remembers the callers it found by their key (app.auth.caller_cache) and
listens on the channel ``gateway_api_keys``. This trigger notifies it whenever a key's
value, state, permitted models or limit change, or a key is removed, whatever changed
it (the gateway, the flask commands, an operator's SQL). The hot path's own updates of
the key's row (its month's spend, its holds, its last use) set none of these columns
and notify nobody. SQLite has no notifications: there the gateway remembers no caller.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23 06:30:00

"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION gateway_notify_key_change() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('gateway_api_keys', '');
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER api_keys_changed
        AFTER UPDATE OF account_id, digest, state, permitted_models, monthly_limit
            OR DELETE OR TRUNCATE ON api_keys
        FOR EACH STATEMENT EXECUTE FUNCTION gateway_notify_key_change()
        """
    )


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER api_keys_changed ON api_keys")
    op.execute("DROP FUNCTION gateway_notify_key_change()")
