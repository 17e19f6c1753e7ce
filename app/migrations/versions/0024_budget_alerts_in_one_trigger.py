"""budget alerts: one trigger a table on PostgreSQL, whose condition is cheap to check

PostgreSQL reads a trigger's WHEN condition from its stored text again in every
statement that updates the table's column it watches: every settlement sets the
``window_spent`` of its key and member, which read the long conditions of each table's
two budget triggers (migrations 0021, 0022) four times a request, about a sixth of the
server's work for it, with or without a budget. One trigger a table now fires only for
a budget whose window's spend has reached 1% of it, the least share an organisation
can be alerted at; its function writes the events whose crossings the UPDATE made,
``budget.exhausted`` first, then ``budget.threshold_reached`` at the organisation's
percentage, which it reads only when the budget was not used up before. The balance
trigger's condition loses its redundant first test. SQLite compiles its triggers into
the statement it prepares once: its triggers stay, but for ``budget.exhausted``, whose
event now says 100 percent on both databases, not the early alert's 80.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 12:00:00

"""

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_HOLDERS = (("memberships", "member_id"), ("api_keys", "key_id"))
# Spend in the window before the UPDATE: none if the UPDATE started a new window.
_SPENT_BEFORE = "(CASE WHEN OLD.window_start = NEW.window_start THEN OLD.window_spent ELSE 0 END)"
# A NULL budget makes the comparison NULL, which does not fire the trigger.
_REACHED_ONE_PERCENT = "NEW.window_spent * 100 >= NEW.budget"
_BALANCE_CROSSED = "OLD.balance >= NEW.alert_below AND NEW.balance < NEW.alert_below"
_BALANCE_CROSSED_BEFORE = f"NEW.alert_below IS NOT NULL AND {_BALANCE_CROSSED}"
_EXHAUSTED = f"{_SPENT_BEFORE} < NEW.budget AND NEW.window_spent >= NEW.budget"
_INSERT = "INSERT INTO alert_events (account_id, type, data, created, fanned_out)"


def _data(json_object: str, holder_id: str, percent: str) -> str:
    return (
        f"{json_object}('organisation_id', NEW.account_id, '{holder_id}', NEW.id,"
        " 'budget', NEW.budget, 'spent', NEW.window_spent, 'window', NEW.budget_window,"
        f" 'percent', {percent})"
    )


def _event(event_type: str, holder_id: str, percent: str) -> str:
    data = _data("json_build_object", holder_id, percent)
    return f"""
                {_INSERT}
                VALUES (NEW.account_id, '{event_type}', {data}::text,
                        extract(epoch FROM now())::bigint, false);"""


def _budget_function(table: str, holder_id: str) -> str:
    return f"""
        CREATE FUNCTION gateway_{table}_budget_crossed() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            spent_before bigint := {_SPENT_BEFORE};
            percent smallint;
        BEGIN
            IF spent_before >= NEW.budget THEN
                RETURN NULL;
            END IF;
            IF NEW.window_spent >= NEW.budget THEN
                {_event("budget.exhausted", holder_id, "100")}
            END IF;
            SELECT budget_alert_percent INTO percent FROM accounts
            WHERE accounts.id = NEW.account_id;
            IF spent_before * 100 < NEW.budget * percent
                AND NEW.window_spent * 100 >= NEW.budget * percent THEN
                {_event("budget.threshold_reached", holder_id, "percent")}
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


def _sqlite_exhausted_trigger(table: str, holder_id: str, percent: str) -> None:
    op.execute(f"DROP TRIGGER {table}_budget_exhausted")
    op.execute(
        f"""
        CREATE TRIGGER {table}_budget_exhausted
        AFTER UPDATE OF window_spent ON {table}
        WHEN NEW.budget IS NOT NULL AND {_EXHAUSTED}
        BEGIN
            {_INSERT}
            VALUES (
                NEW.account_id, 'budget.exhausted', {_data("json_object", holder_id, percent)},
                CAST(strftime('%s', 'now') AS INTEGER), 0
            );
        END
        """
    )


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        for table, holder_id in _HOLDERS:
            _sqlite_exhausted_trigger(table, holder_id, "100")
        return
    for table, holder_id in _HOLDERS:
        for name in ("budget_exhausted", "budget_threshold_reached"):
            op.execute(f"DROP TRIGGER {table}_{name} ON {table}")
            op.execute(f"DROP FUNCTION gateway_{table}_{name}()")
        op.execute(_budget_function(table, holder_id))
        op.execute(
            f"""
            CREATE TRIGGER {table}_budget_crossed AFTER UPDATE OF window_spent ON {table}
            FOR EACH ROW WHEN ({_REACHED_ONE_PERCENT})
            EXECUTE FUNCTION gateway_{table}_budget_crossed()
            """
        )
    op.execute("DROP TRIGGER accounts_balance_below_threshold ON accounts")
    op.execute(_balance_trigger(_BALANCE_CROSSED))


def downgrade():
    # Back to 0022's triggers: 0021's for budget.exhausted (percent 80 in its event),
    # 0022's for budget.threshold_reached.
    if op.get_bind().dialect.name != "postgresql":
        for table, holder_id in _HOLDERS:
            _sqlite_exhausted_trigger(table, holder_id, "80")
        return
    op.execute("DROP TRIGGER accounts_balance_below_threshold ON accounts")
    op.execute(_balance_trigger(_BALANCE_CROSSED_BEFORE))
    for table, holder_id in _HOLDERS:
        op.execute(f"DROP TRIGGER {table}_budget_crossed ON {table}")
        op.execute(f"DROP FUNCTION gateway_{table}_budget_crossed()")
        _create_one_event_trigger(
            table,
            "budget_exhausted",
            f"NEW.budget IS NOT NULL AND {_EXHAUSTED}",
            _event("budget.exhausted", holder_id, "80"),
        )
        _create_one_event_trigger(
            table,
            "budget_threshold_reached",
            f"NEW.budget IS NOT NULL AND {_SPENT_BEFORE} < NEW.budget"
            " AND NEW.window_spent * 100 >= NEW.budget",
            f"""SELECT budget_alert_percent INTO percent FROM accounts
                WHERE accounts.id = NEW.account_id;
                IF percent IS NOT NULL AND {_SPENT_BEFORE} * 100 < NEW.budget * percent
                    AND NEW.window_spent * 100 >= NEW.budget * percent THEN
                    {_event("budget.threshold_reached", holder_id, "percent")}
                END IF;""",
        )


def _create_one_event_trigger(table: str, name: str, condition: str, body: str) -> None:
    op.execute(
        f"""
        CREATE FUNCTION gateway_{table}_{name}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            percent smallint;
        BEGIN
            {body}
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER {table}_{name} AFTER UPDATE OF window_spent ON {table}
        FOR EACH ROW WHEN ({condition})
        EXECUTE FUNCTION gateway_{table}_{name}()
        """
    )
