"""budget alerts: one trigger a table on PostgreSQL, whose condition is cheap to check

PostgreSQL reads a trigger's WHEN condition from its stored text again in every
statement that updates the table's column it watches: every settlement sets the
``window_spent`` of its key and member, which read the two long conditions of each
table's two budget triggers (migration 0021) four times a request, about a sixth of
the server's work for it, with or without a budget. One trigger a table now fires
only for a budget whose window's spend has reached its alert threshold; its function
writes the events whose crossings the UPDATE made, as the two triggers did, once per
crossing. The balance trigger's condition loses its redundant first test. SQLite
compiles its triggers into the statement it prepares once: its triggers stay.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28 12:00:00

"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

# As migration 0021 has them.
BUDGET_ALERT_PERCENT = 80
_HOLDERS = (("memberships", "member_id"), ("api_keys", "key_id"))
_OLD_TRIGGERS = ("budget_exhausted", "budget_threshold_reached")
_OLD_EVENTS = {"budget_exhausted": (1, 1), "budget_threshold_reached": (100, BUDGET_ALERT_PERCENT)}
# Spend in the window before the UPDATE: none if the UPDATE started a new window.
_SPENT_BEFORE = "(CASE WHEN OLD.window_start = NEW.window_start THEN OLD.window_spent ELSE 0 END)"
# A NULL budget or threshold makes a comparison NULL, which does not fire a trigger.
_REACHED_THRESHOLD = f"NEW.window_spent * 100 >= NEW.budget * {BUDGET_ALERT_PERCENT}"
_BALANCE_CROSSED = "OLD.balance >= NEW.alert_below AND NEW.balance < NEW.alert_below"
_BALANCE_CROSSED_BEFORE = (
    "NEW.alert_below IS NOT NULL AND OLD.balance >= NEW.alert_below"
    " AND NEW.balance < NEW.alert_below"
)


def _event(event_type: str, holder_id: str) -> str:
    return f"""
            INSERT INTO alert_events (account_id, type, data, created, fanned_out)
            VALUES (NEW.account_id, '{event_type}', json_build_object(
                'organisation_id', NEW.account_id, '{holder_id}', NEW.id,
                'budget', NEW.budget, 'spent', NEW.window_spent, 'window', NEW.budget_window,
                'percent', {BUDGET_ALERT_PERCENT})::text,
                extract(epoch FROM now())::bigint, false);"""


def _budget_function(table: str, holder_id: str) -> str:
    # The events in the order the two triggers wrote them (by their names).
    return f"""
        CREATE FUNCTION gateway_{table}_budget_crossed() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            spent_before bigint := {_SPENT_BEFORE};
        BEGIN
            IF spent_before < NEW.budget AND NEW.window_spent >= NEW.budget THEN
                {_event("budget.exhausted", holder_id)}
            END IF;
            IF spent_before * 100 < NEW.budget * {BUDGET_ALERT_PERCENT} THEN
                {_event("budget.threshold_reached", holder_id)}
            END IF;
            RETURN NULL;
        END
        $$
        """


def _balance_trigger(condition: str) -> str:
    return f"""
        CREATE TRIGGER accounts_balance_below_threshold
        AFTER UPDATE OF balance ON accounts
        FOR EACH ROW WHEN ({condition})
        EXECUTE FUNCTION gateway_balance_below_threshold()
        """


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, holder_id in _HOLDERS:
        for name in _OLD_TRIGGERS:
            op.execute(f"DROP TRIGGER {table}_{name} ON {table}")
            op.execute(f"DROP FUNCTION gateway_{table}_{name}()")
        op.execute(_budget_function(table, holder_id))
        op.execute(
            f"""
            CREATE TRIGGER {table}_budget_crossed AFTER UPDATE OF window_spent ON {table}
            FOR EACH ROW WHEN ({_REACHED_THRESHOLD})
            EXECUTE FUNCTION gateway_{table}_budget_crossed()
            """
        )
    op.execute("DROP TRIGGER accounts_balance_below_threshold ON accounts")
    op.execute(_balance_trigger(_BALANCE_CROSSED))


def downgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER accounts_balance_below_threshold ON accounts")
    op.execute(_balance_trigger(_BALANCE_CROSSED_BEFORE))
    for table, holder_id in _HOLDERS:
        op.execute(f"DROP TRIGGER {table}_budget_crossed ON {table}")
        op.execute(f"DROP FUNCTION gateway_{table}_budget_crossed()")
        for name in _OLD_TRIGGERS:
            event_type = name.replace("_", ".", 1)
            spend_times, budget_times = _OLD_EVENTS[name]
            crossed = (
                f"NEW.budget IS NOT NULL AND {_SPENT_BEFORE} * {spend_times} < NEW.budget"
                f" * {budget_times} AND NEW.window_spent * {spend_times} >= NEW.budget"
                f" * {budget_times}"
            )
            op.execute(
                f"""
                CREATE FUNCTION gateway_{table}_{name}() RETURNS trigger
                LANGUAGE plpgsql AS $$
                BEGIN
                    {_event(event_type, holder_id)}
                    RETURN NULL;
                END
                $$
                """
            )
            op.execute(
                f"""
                CREATE TRIGGER {table}_{name} AFTER UPDATE OF window_spent ON {table}
                FOR EACH ROW WHEN ({crossed})
                EXECUTE FUNCTION gateway_{table}_{name}()
                """
            )
