"""The ledger's prebuilt statements: what each sends to the database on every request."""

from __future__ import annotations

from app.credits.sql import guards
from app.credits.sql import holds as hold_sql
from app.credits.sql import settlement as settlement_sql
from app.database.driver import driver_form
from app.extensions import db
from app.generations.lifecycle import INSERT_GENERATION

# What a hold with a key sends: its own values and the budget windows' starts, each once.
HOLD_PARAMETERS = {
    "hold_id",
    "holder_id",
    "amount",
    "key_id",
    "key_digest",
    "placed_at",
    "expires_at",
    "day_start",
    "week_start",
    "month_start",
    "now_micros",
}
# What a covered settlement with a key sends beside its record: the rows' windows once.
SETTLEMENT_PARAMETERS = {
    "hold_id",
    "open",
    "charge",
    "released",
    "key_id",
    "used_at",
    "used_micros",
    "generation_id",
    "day_start",
    "week_start",
    "month_start",
    "commit_waits",
}


def test_a_hold_binds_each_value_once_and_no_constant(app_context):
    hold = hold_sql.hold_in_one_statement(
        guards.ACCOUNT_COVERS, guards.KEY_WITHIN_LIMIT, guards.MEMBER_WITHIN_BUDGET
    )
    prepared = driver_form(hold, db.engine.dialect)
    assert sorted(prepared.names) == sorted(HOLD_PARAMETERS)


def test_the_steps_of_a_hold_bind_each_value_once(app_context):
    on_key = hold_sql.reserve_on_key(guards.KEY_WITHIN_LIMIT)
    form = driver_form(on_key, db.engine.dialect)
    assert len(form.names) == len(set(form.names))
    assert set(form.names) == {
        "key_id",
        "key_digest",
        "amount",
        "day_start",
        "week_start",
        "month_start",
        "now_micros",
    }


def test_a_settlement_with_its_record_sends_the_rollups_values_once(app_context):
    recorded = tuple(INSERT_GENERATION.table.c.keys())
    record = INSERT_GENERATION, recorded
    settlement = settlement_sql.settlement_in_one_statement(True, True, record, True)
    names = driver_form(settlement, db.engine.dialect).names
    assert not [name for name in names if name.startswith(settlement_sql.ROLLUP_PREFIX)]
    assert sorted(names) == sorted(
        {settlement_sql.RECORD_PREFIX + name for name in recorded} | SETTLEMENT_PARAMETERS
    )
