"""The money path under seeded random schedules of requests, faults and time.

Replay a failure with ``pytest tests/simulation --seed N --steps M``; see
docs/contributing/testing.md, "Simulating the money path".
"""

from __future__ import annotations

import pytest

from tests.simulation import driver
from tests.simulation.simulator import Simulation, SimulationFailure

PLANTED_STEPS = 600
# A seed whose schedule meets each planted bug within PLANTED_STEPS, but one.
PLANTED_SEED = 4
# The seed whose schedule retries an Idempotency-Key after its claim's TTL while its
# generation charged something, within PLANTED_STEPS (PLANTED_SEED's does not).
TAKEOVER_SEED = 3


def test_the_money_path_keeps_its_invariants(app, monkeypatch, seed, steps, schedule_file):
    Simulation(app, monkeypatch, seed=seed, steps=steps, schedule_file=schedule_file).run()


def test_a_seed_replays_its_schedule_exactly(app, monkeypatch):
    def schedule(seed):
        simulation = Simulation(app, monkeypatch, seed=seed, steps=100)
        simulation.run()
        return simulation.schedule

    first = schedule(11)
    # Whatever the process went through before, however slow the machine.
    driver.disturb_the_process(monkeypatch)
    assert schedule(11) == first
    assert schedule(12) != first


def test_a_hold_placed_whatever_the_balance_is_caught(disposable_app, monkeypatch):
    driver.plant_hold_without_balance_condition(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure,
        match=rf"(?s)seed {PLANTED_SEED}, step \d+.*past the available balance"
        rf".*--seed {PLANTED_SEED}",
    ):
        simulation.run()


def test_a_hold_past_the_key_limit_is_caught(disposable_app, monkeypatch):
    driver.plant_hold_past_the_key_limit(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure, match=rf"(?s)seed {PLANTED_SEED}, step \d+.*past its key's budget"
    ):
        simulation.run()


def test_a_hold_past_the_member_budget_is_caught(disposable_app, monkeypatch):
    driver.plant_hold_past_the_member_budget(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure, match=rf"(?s)seed {PLANTED_SEED}, step \d+.*past its member's budget"
    ):
        simulation.run()


def test_rollups_that_miss_requests_are_caught(disposable_app, monkeypatch):
    driver.plant_rollups_that_miss_requests(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure,
        match=rf"(?s)seed {PLANTED_SEED}, step \d+.*usage rollup .* requests 0 but",
    ):
        simulation.run()


def test_a_settlement_run_twice_is_caught(disposable_app, monkeypatch):
    driver.plant_settlement_that_forgets(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure,
        match=rf"(?s)seed {PLANTED_SEED}, step \d+.*(IntegrityError|AlreadyRecorded)",
    ):
        simulation.run()


def test_a_charge_of_the_whole_hold_is_caught(disposable_app, monkeypatch):
    driver.plant_charge_of_the_whole_hold(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure, match=rf"(?s)seed {PLANTED_SEED}, step \d+.*charged .* expected"
    ):
        simulation.run()


def test_usage_beyond_the_hold_left_unpaid_is_caught(disposable_app, monkeypatch):
    driver.plant_charge_capped_at_the_hold(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure, match=rf"(?s)seed {PLANTED_SEED}, step \d+.*charged .* expected"
    ):
        simulation.run()


def test_a_claim_taken_over_whatever_it_charged_is_caught(disposable_app, monkeypatch):
    driver.plant_claim_taken_over_after_its_ttl(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=TAKEOVER_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure, match=rf"(?s)seed {TAKEOVER_SEED}, step \d+.*retry of idem-"
    ):
        simulation.run()


def test_a_dead_streams_progress_left_unbilled_is_caught(disposable_app, monkeypatch):
    driver.plant_progress_never_recorded(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure, match=rf"(?s)seed {PLANTED_SEED}, step \d+.*recorded 0 streams"
    ):
        simulation.run()


def test_a_response_continued_by_another_account_is_caught(disposable_app, monkeypatch):
    driver.plant_chains_of_any_account(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure, match=rf"(?s)seed {PLANTED_SEED}, step \d+.*(should get|expected) 404"
    ):
        simulation.run()


def test_a_block_the_prompt_counter_skips_is_caught(disposable_app, monkeypatch):
    driver.plant_uncounted_block(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure,
        match=rf"(?s)seed {PLANTED_SEED}, step \d+.*its upstream was sent .* past its hold",
    ):
        simulation.run()


def test_a_tier_priced_at_one_is_caught(disposable_app, monkeypatch):
    driver.plant_tier_priced_at_one(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure, match=rf"(?s)seed {PLANTED_SEED}, step \d+.*native.*charged"
    ):
        simulation.run()


def test_a_relayed_stream_billed_at_its_first_usage_is_caught(disposable_app, monkeypatch):
    driver.plant_relayed_usage_read_once(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    with pytest.raises(
        SimulationFailure,
        match=rf"(?s)seed {PLANTED_SEED}, step \d+.*native stream.*recorded tokens",
    ):
        simulation.run()


def test_a_grant_that_leaves_the_chains_head_behind_is_caught_at_its_step(
    disposable_app, monkeypatch
):
    driver.plant_grants_that_leave_the_head_behind(monkeypatch)
    simulation = Simulation(disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS)
    # The run stops at the grant itself: the chain is checked after every step.
    with pytest.raises(
        SimulationFailure,
        match=rf"(?s)seed {PLANTED_SEED}, step (\d+) of .*chain of account \d+, its row: "
        r"its head is not its last entry's digest.*\n\1: grant ",
    ):
        simulation.run()
