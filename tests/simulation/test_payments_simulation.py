"""The money path's simulation with payments, refunds and redemption codes among its steps.

Replay a failure with ``pytest tests/simulation/test_payments_simulation.py --seed N --steps M``.
"""

from __future__ import annotations

import pytest

from tests.simulation.payments import (
    PaymentsSimulation,
    plant_event_ids_forgotten,
    plant_refund_of_all_refunded_so_far,
)
from tests.simulation.simulator import SimulationFailure

PLANTED_STEPS = 400
# A seed whose schedule meets each planted bug of payments within PLANTED_STEPS.
PLANTED_SEED = 2


def test_payments_keep_the_money_paths_invariants(app, monkeypatch, seed, steps, schedule_file):
    PaymentsSimulation(app, monkeypatch, seed=seed, steps=steps, schedule_file=schedule_file).run()


def test_a_seed_replays_its_payments_exactly(app, monkeypatch):
    def schedule(seed):
        simulation = PaymentsSimulation(app, monkeypatch, seed=seed, steps=80)
        simulation.run()
        return simulation.schedule

    first = schedule(11)
    assert schedule(11) == first
    assert schedule(12) != first


def test_a_redelivered_event_applied_again_is_caught(disposable_app, monkeypatch):
    plant_event_ids_forgotten(monkeypatch)
    simulation = PaymentsSimulation(
        disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS
    )
    with pytest.raises(
        SimulationFailure, match=r"(?s)seed 2, step \d+.*evt_\w+ \(.*\) was applied again"
    ):
        simulation.run()


def test_a_refund_taking_back_all_refunded_so_far_is_caught(disposable_app, monkeypatch):
    plant_refund_of_all_refunded_so_far(monkeypatch)
    simulation = PaymentsSimulation(
        disposable_app, monkeypatch, seed=PLANTED_SEED, steps=PLANTED_STEPS
    )
    with pytest.raises(
        SimulationFailure, match=r"(?s)seed 2, step \d+.*taken back, \$[\d.]+ refunded"
    ):
        simulation.run()
