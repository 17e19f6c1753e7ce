"""alerts: an organisation's balance threshold, its alert events, endpoints and deliveries

``accounts.alert_below`` is the balance (in money units) under which the organisation
is alerted. A trigger on ``accounts`` writes one ``balance.below_threshold`` event into
``alert_events`` (the outbox) when an UPDATE takes the balance from at or above the
threshold to below it: in the same transaction as the charge, under the row's lock, so
that one crossing makes one event however many requests race across it; a grant that
lifts the balance back above re-arms it, since the next fall crosses again. Its WHEN
clause keeps every other UPDATE of the balance free of it. The background deliverer
fans each event out into ``alert_deliveries``, one per endpoint of ``alert_endpoints``.

Budgets the same way: triggers on ``memberships`` and ``api_keys`` write
``budget.threshold_reached`` when an UPDATE takes a budget's window spend from under
BUDGET_ALERT_PERCENT of the budget to it or above, and ``budget.exhausted`` when it
reaches the whole budget; a new window starts from nothing spent, so it re-arms both.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-26 23:00:00

"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_CROSSED = (
    "NEW.alert_below IS NOT NULL AND OLD.balance >= NEW.alert_below"
    " AND NEW.balance < NEW.alert_below"
)


# Of a budget, the share of its window's spend that is alerted before it is exhausted.
BUDGET_ALERT_PERCENT = 80
# Spend in the window before the UPDATE: none if the UPDATE started a new window.
_SPENT_BEFORE = "(CASE WHEN OLD.window_start = NEW.window_start THEN OLD.window_spent ELSE 0 END)"
# (event type, multiplier of the spend, multiplier of the budget) for each crossing.
_BUDGET_CROSSINGS = (
    ("budget.threshold_reached", 100, BUDGET_ALERT_PERCENT),
    ("budget.exhausted", 1, 1),
)
# (table, the id's name in the event, trigger name prefix)
_BUDGET_HOLDERS = (("memberships", "member_id"), ("api_keys", "key_id"))


def _budget_crossed(spend_times: int, budget_times: int) -> str:
    return (
        f"NEW.budget IS NOT NULL AND {_SPENT_BEFORE} * {spend_times} < NEW.budget * {budget_times}"
        f" AND NEW.window_spent * {spend_times} >= NEW.budget * {budget_times}"
    )


def _budget_data(json_object: str, holder_id: str) -> str:
    return (
        f"{json_object}('organisation_id', NEW.account_id, '{holder_id}', NEW.id,"
        " 'budget', NEW.budget, 'spent', NEW.window_spent, 'window', NEW.budget_window,"
        f" 'percent', {BUDGET_ALERT_PERCENT})"
    )


def upgrade():
    op.add_column("accounts", sa.Column("alert_below", sa.BigInteger(), nullable=True))
    op.create_table(
        "alert_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created", sa.BigInteger(), nullable=False),
        sa.Column("fanned_out", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_alert_events_waiting", "alert_events", ["fanned_out", "id"])
    op.create_table(
        "alert_endpoints",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("account_id", sa.Integer(), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("target", sa.String(length=2000), nullable=False),
        sa.Column("sealed_secret", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("removed_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_alert_endpoints_account_id", "alert_endpoints", ["account_id"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.Integer(), sa.ForeignKey("alert_events.id"), nullable=False),
        sa.Column("endpoint_id", sa.Integer(), sa.ForeignKey("alert_endpoints.id"), nullable=False),
        sa.Column("status", sa.String(length=10), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("delivered_at", sa.DateTime(), nullable=True),
        sa.UniqueConstraint("event_id", "endpoint_id", name="uq_alert_delivery_once"),
    )
    op.create_index("ix_alert_deliveries_due", "alert_deliveries", ["status", "next_attempt_at"])
    if op.get_bind().dialect.name == "postgresql":
        _postgresql_trigger()
        _postgresql_budget_triggers()
    else:
        _sqlite_trigger()
        _sqlite_budget_triggers()


def _sqlite_trigger():
    op.execute(
        f"""
        CREATE TRIGGER accounts_balance_below_threshold
        AFTER UPDATE OF balance ON accounts
        WHEN {_CROSSED}
        BEGIN
            INSERT INTO alert_events (account_id, type, data, created, fanned_out)
            VALUES (
                NEW.id, 'balance.below_threshold',
                json_object('organisation_id', NEW.id, 'threshold', NEW.alert_below,
                            'balance', NEW.balance),
                CAST(strftime('%s', 'now') AS INTEGER), 0
            );
        END
        """
    )


def _sqlite_budget_triggers():
    for table, holder_id in _BUDGET_HOLDERS:
        for event_type, spend_times, budget_times in _BUDGET_CROSSINGS:
            op.execute(
                f"""
                CREATE TRIGGER {table}_{event_type.replace(".", "_")}
                AFTER UPDATE OF window_spent ON {table}
                WHEN {_budget_crossed(spend_times, budget_times)}
                BEGIN
                    INSERT INTO alert_events (account_id, type, data, created, fanned_out)
                    VALUES (
                        NEW.account_id, '{event_type}', {_budget_data("json_object", holder_id)},
                        CAST(strftime('%s', 'now') AS INTEGER), 0
                    );
                END
                """
            )


def _postgresql_budget_triggers():
    for table, holder_id in _BUDGET_HOLDERS:
        for event_type, spend_times, budget_times in _BUDGET_CROSSINGS:
            name = f"{table}_{event_type.replace('.', '_')}"
            data = _budget_data("json_build_object", holder_id)
            op.execute(
                f"""
                CREATE FUNCTION gateway_{name}() RETURNS trigger
                LANGUAGE plpgsql AS $$
                BEGIN
                    INSERT INTO alert_events (account_id, type, data, created, fanned_out)
                    VALUES (NEW.account_id, '{event_type}', {data}::text,
                            extract(epoch FROM now())::bigint, false);
                    RETURN NULL;
                END
                $$
                """
            )
            op.execute(
                f"""
                CREATE TRIGGER {name} AFTER UPDATE OF window_spent ON {table}
                FOR EACH ROW WHEN ({_budget_crossed(spend_times, budget_times)})
                EXECUTE FUNCTION gateway_{name}()
                """
            )


def _budget_trigger_names():
    for table, _ in _BUDGET_HOLDERS:
        for event_type, _, _ in _BUDGET_CROSSINGS:
            yield table, f"{table}_{event_type.replace('.', '_')}"


def _postgresql_trigger():
    op.execute(
        """
        CREATE FUNCTION gateway_balance_below_threshold() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO alert_events (account_id, type, data, created, fanned_out)
            VALUES (
                NEW.id, 'balance.below_threshold',
                json_build_object('organisation_id', NEW.id, 'threshold', NEW.alert_below,
                                  'balance', NEW.balance)::text,
                extract(epoch FROM now())::bigint, false
            );
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        f"""
        CREATE TRIGGER accounts_balance_below_threshold
        AFTER UPDATE OF balance ON accounts
        FOR EACH ROW WHEN ({_CROSSED})
        EXECUTE FUNCTION gateway_balance_below_threshold()
        """
    )


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER accounts_balance_below_threshold ON accounts")
        op.execute("DROP FUNCTION gateway_balance_below_threshold()")
        for table, name in _budget_trigger_names():
            op.execute(f"DROP TRIGGER {name} ON {table}")
            op.execute(f"DROP FUNCTION gateway_{name}()")
    else:
        op.execute("DROP TRIGGER accounts_balance_below_threshold")
        for _, name in _budget_trigger_names():
            op.execute(f"DROP TRIGGER {name}")
    op.drop_table("alert_deliveries")
    op.drop_table("alert_endpoints")
    op.drop_table("alert_events")
    op.drop_column("accounts", "alert_below")
