"""ledger entries are append-only

The balance is audited against the sum of the ledger, so a ledger row that could be
changed or removed would make the audit prove nothing: the database itself refuses
UPDATE and DELETE on ledger_entries, whatever code or operator sends them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 05:52:00

"""
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

MESSAGE = "ledger entries are append-only"


def upgrade():
    if op.get_context().dialect.name == "postgresql":
        op.execute(
            f"""
            CREATE FUNCTION ledger_entries_append_only() RETURNS trigger AS $$
            BEGIN
                RAISE EXCEPTION '{MESSAGE}';
            END;
            $$ LANGUAGE plpgsql
            """
        )
        op.execute(
            "CREATE TRIGGER ledger_entries_append_only BEFORE UPDATE OR DELETE ON ledger_entries "
            "FOR EACH ROW EXECUTE FUNCTION ledger_entries_append_only()"
        )
        return
    for action in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER ledger_entries_no_{action.lower()} BEFORE {action} ON ledger_entries "
            f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        )


def downgrade():
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER ledger_entries_append_only ON ledger_entries")
        op.execute("DROP FUNCTION ledger_entries_append_only()")
        return
    for action in ("update", "delete"):
        op.execute(f"DROP TRIGGER ledger_entries_no_{action}")
