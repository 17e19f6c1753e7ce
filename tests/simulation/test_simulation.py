"""The money path under seeded random schedules of requests, faults and time.

Replay a failure with ``pytest tests/simulation --seed N --steps M``; see the README's
"Simulating the money path".
"""

from __future__ import annotations

import pytest

from tests.simulation import driver
from tests.simulation.simulator import Faults, Simulation, SimulationFailure

PLANTED_STEPS = 600
# Runs with a fault the ledger does not survive yet stop at its first violation; the
# budget leaves room for the schedule to reach it.
FAULT_STEPS = 2000


def test_the_money_path_keeps_its_invariants(app, monkeypatch, seed, steps, schedule_file):
    Simulation(app, monkeypatch, seed=seed, steps=steps, schedule_file=schedule_file).run()


def test_a_seed_replays_its_schedule_exactly(app, monkeypatch):
    def schedule(seed):
        simulation = Simulation(app, monkeypatch, seed=seed, steps=100)
        simulation.run()
        return simulation.schedule

    first = schedule(11)
    assert schedule(11) == first
    assert schedule(12) != first


def test_a_hold_placed_whatever_the_balance_is_caught(disposable_app, monkeypatch):
    driver.plant_hold_without_balance_condition(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=1, steps=PLANTED_STEPS)
    with pytest.raises(SimulationFailure, match=r"(?s)seed 1, step \d+.*below zero.*--seed 1"):
        simulation.run()


def test_a_hold_past_the_key_limit_is_caught(disposable_app, monkeypatch):
    driver.plant_hold_past_the_key_limit(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=1, steps=PLANTED_STEPS)
    with pytest.raises(SimulationFailure, match=r"(?s)seed 1, step \d+.*past its monthly limit"):
        simulation.run()


def test_a_settlement_run_twice_is_caught(disposable_app, monkeypatch):
    driver.plant_settlement_that_forgets(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=1, steps=PLANTED_STEPS)
    with pytest.raises(SimulationFailure, match=r"(?s)seed 1, step \d+.*IntegrityError"):
        simulation.run()


def test_a_charge_of_the_whole_hold_is_caught(disposable_app, monkeypatch):
    driver.plant_charge_of_the_whole_hold(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=1, steps=PLANTED_STEPS)
    with pytest.raises(SimulationFailure, match=r"(?s)seed 1, step \d+.*charged .* expected"):
        simulation.run()


@pytest.mark.xfail(
    raises=SimulationFailure,
    strict=True,
    reason="settle_hold caps a charge at its hold although the account has more: the "
    "usage beyond the hold is neither charged nor recorded, and the audit flags the cost",
)
def test_usage_beyond_the_hold_is_charged_up_to_what_the_account_has(disposable_app, monkeypatch):
    faults = Faults(overuse=True)
    Simulation(disposable_app, monkeypatch, seed=1, steps=FAULT_STEPS, faults=faults).run()


@pytest.mark.xfail(
    raises=SimulationFailure,
    strict=True,
    reason="settling inserts the generation record with the deleted key's id: the foreign "
    "key fails, the charge is rolled back and the hold stays open until it expires",
)
def test_a_key_deleted_while_its_request_runs_does_not_stop_the_charge(disposable_app, monkeypatch):
    faults = Faults(delete_keys_in_flight=True)
    Simulation(disposable_app, monkeypatch, seed=1, steps=FAULT_STEPS, faults=faults).run()


@pytest.mark.xfail(
    raises=SimulationFailure,
    strict=True,
    reason="a hold is renewed only when a chunk is relayed: a stream whose caller reads "
    "slower than the TTL loses its hold, and its charge is then cut to what is available",
)
def test_a_stream_read_slowly_keeps_its_hold(disposable_app, monkeypatch):
    faults = Faults(slow_callers=True)
    Simulation(disposable_app, monkeypatch, seed=1, steps=FAULT_STEPS, faults=faults).run()


@pytest.mark.xfail(
    raises=SimulationFailure,
    strict=True,
    reason="a key's holds and charges count against its limit only for requests admitted "
    "while it had one: a limit set while others run lets the key's month pass it by theirs",
)
def test_a_limit_set_while_the_key_is_in_use_still_holds(disposable_app, monkeypatch):
    faults = Faults(limit_keys_in_flight=True)
    Simulation(disposable_app, monkeypatch, seed=5, steps=FAULT_STEPS, faults=faults).run()
