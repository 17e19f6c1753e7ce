"""alert settings: each organisation's budget alert percentage; a threshold set above the balance

``accounts.budget_alert_percent`` (1-99, default 80; NULL: no early alert) is the share
of a budget's window at which ``budget.threshold_reached`` fires, in place of the fixed
80 of 0021: the triggers on ``memberships`` and ``api_keys`` read it from the key's or
member's organisation. On SQLite their WHEN clause reads it; PostgreSQL allows no
subquery in a WHEN, so there the WHEN keeps every UPDATE that cannot cross (no budget,
under 1%, already past the whole) away from the function, which reads the percentage.

A threshold raised above the balance is a crossing too: a trigger on UPDATE OF
``alert_below`` writes ``balance.below_threshold`` when the balance was not already
under the previous threshold (whose event was written then).

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28 09:30:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

DEFAULT_PERCENT = 80
_BUDGET_HOLDERS = (("memberships", "member_id"), ("api_keys", "key_id"))
# Spend in the window before the UPDATE: none if the UPDATE started a new window.
_SPENT_BEFORE = "(CASE WHEN OLD.window_start = NEW.window_start THEN OLD.window_spent ELSE 0 END)"
_PERCENT = "(SELECT budget_alert_percent FROM accounts WHERE accounts.id = NEW.account_id)"
_EVENT_COLUMNS = "INSERT INTO alert_events (account_id, type, data, created, fanned_out)"
_THRESHOLD_SET_BELOW = (
    "NEW.alert_below IS NOT NULL AND NEW.balance < NEW.alert_below"
    " AND (OLD.alert_below IS NULL OR OLD.balance >= OLD.alert_below)"
)


def _crossed(percent: str) -> str:
    """The window's spend went from under ``percent`` of the budget to it or above."""
    return (
        f"{_SPENT_BEFORE} * 100 < NEW.budget * {percent}"
        f" AND NEW.window_spent * 100 >= NEW.budget * {percent}"
    )


def _budget_data(json_object: str, holder_id: str, percent: str) -> str:
    return (
        f"{json_object}('organisation_id', NEW.account_id, '{holder_id}', NEW.id,"
        " 'budget', NEW.budget, 'spent', NEW.window_spent, 'window', NEW.budget_window,"
        f" 'percent', {percent})"
    )


def _balance_data(json_object: str) -> str:
    return (
        f"{json_object}('organisation_id', NEW.id, 'threshold', NEW.alert_below,"
        " 'balance', NEW.balance)"
    )


def upgrade():
    op.add_column(
        "accounts",
        sa.Column(
            "budget_alert_percent",
            sa.SmallInteger(),
            nullable=True,
            server_default=str(DEFAULT_PERCENT),
        ),
    )
    if op.get_bind().dialect.name == "postgresql":
        _postgresql_upgrade()
    else:
        _sqlite_upgrade()


def _sqlite_upgrade():
    for table, holder_id in _BUDGET_HOLDERS:
        op.execute(f"DROP TRIGGER {table}_budget_threshold_reached")
        _sqlite_threshold_trigger(table, holder_id, _PERCENT)
    op.execute(
        f"""
        CREATE TRIGGER accounts_threshold_set_above_balance
        AFTER UPDATE OF alert_below ON accounts
        WHEN {_THRESHOLD_SET_BELOW}
        BEGIN
            {_EVENT_COLUMNS}
            VALUES (
                NEW.id, 'balance.below_threshold', {_balance_data("json_object")},
                CAST(strftime('%s', 'now') AS INTEGER), 0
            );
        END
        """
    )


def _sqlite_threshold_trigger(table: str, holder_id: str, percent: str) -> None:
    op.execute(
        f"""
        CREATE TRIGGER {table}_budget_threshold_reached
        AFTER UPDATE OF window_spent ON {table}
        WHEN NEW.budget IS NOT NULL AND {_crossed(percent)}
        BEGIN
            {_EVENT_COLUMNS}
            VALUES (
                NEW.account_id, 'budget.threshold_reached',
                {_budget_data("json_object", holder_id, percent)},
                CAST(strftime('%s', 'now') AS INTEGER), 0
            );
        END
        """
    )


def _postgresql_upgrade():
    for table, holder_id in _BUDGET_HOLDERS:
        op.execute(f"DROP TRIGGER {table}_budget_threshold_reached ON {table}")
        _postgresql_threshold_trigger(
            table,
            holder_id,
            "SELECT budget_alert_percent INTO percent FROM accounts"
            " WHERE accounts.id = NEW.account_id;",
        )
    op.execute(
        f"""
        CREATE FUNCTION gateway_threshold_set_above_balance() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            {_EVENT_COLUMNS}
            VALUES (NEW.id, 'balance.below_threshold', {_balance_data("json_build_object")}::text,
                    extract(epoch FROM now())::bigint, false);
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER accounts_threshold_set_above_balance
        AFTER UPDATE OF alert_below ON accounts
        FOR EACH ROW WHEN ({_THRESHOLD_SET_BELOW})
        EXECUTE FUNCTION gateway_threshold_set_above_balance()
        """
    )


def _postgresql_threshold_trigger(table: str, holder_id: str, read_percent: str) -> None:
    """Create the function and trigger; ``read_percent`` is plpgsql setting ``percent``."""
    name = f"{table}_budget_threshold_reached"
    data = _budget_data("json_build_object", holder_id, "percent")
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION gateway_{name}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            percent smallint;
        BEGIN
            {read_percent}
            IF percent IS NOT NULL AND {_crossed("percent")} THEN
                {_EVENT_COLUMNS}
                VALUES (NEW.account_id, 'budget.threshold_reached', {data}::text,
                        extract(epoch FROM now())::bigint, false);
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER {name} AFTER UPDATE OF window_spent ON {table}
        FOR EACH ROW WHEN (
            NEW.budget IS NOT NULL AND {_SPENT_BEFORE} < NEW.budget
            AND NEW.window_spent * 100 >= NEW.budget
        )
        EXECUTE FUNCTION gateway_{name}()
        """
    )


def downgrade():
    # Back to 0021's fixed percentage.
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER accounts_threshold_set_above_balance ON accounts")
        op.execute("DROP FUNCTION gateway_threshold_set_above_balance()")
        for table, holder_id in _BUDGET_HOLDERS:
            op.execute(f"DROP TRIGGER {table}_budget_threshold_reached ON {table}")
            _postgresql_threshold_trigger(table, holder_id, f"percent := {DEFAULT_PERCENT};")
    else:
        op.execute("DROP TRIGGER accounts_threshold_set_above_balance")
        for table, holder_id in _BUDGET_HOLDERS:
            op.execute(f"DROP TRIGGER {table}_budget_threshold_reached")
            _sqlite_threshold_trigger(table, holder_id, str(DEFAULT_PERCENT))
    op.drop_column("accounts", "budget_alert_percent")
