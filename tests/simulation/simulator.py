"""A seeded simulation of the money path: requests interleaved step by step, with faults.

Everything the simulator decides (which request moves, what its upstream sends, when a
caller hangs up, a worker dies or time jumps) comes from one ``random.Random(seed)``, so
a seed replays the same schedule against the real ledger and database. After every step
the database's truth is checked against the invariants; the first violation stops the
run with the seed, the step and the schedule up to it. What the budgets of keys and
members hold, and so which hold a 402 refuses, is foretold by the simulator's own
account of them (``budget_model``).
"""

from __future__ import annotations

import math
import random
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app.budgets import WINDOWS
from app.providers.base import Usage
from app.providers.errors import UpstreamError
from tests.simulation import driver
from tests.simulation.budget_model import BALANCE, KEY, MEMBER, BudgetModel, Counters, Forecast
from tests.simulation.upstream import (
    NativeUsage,
    SimulatedAdapter,
    SimulatedNativeAdapter,
    UpstreamScript,
)

# Far in the future, so that no other process's sweeper (its clock is the real one)
# releases a simulated hold; an hour before a month ends, so long runs cross into the next.
START = datetime(2031, 1, 31, 23, 0, tzinfo=UTC)
ACTIVE, REVOKED, DELETED = "active", "revoked", "deleted"
NEW, OPEN, STREAMING, ENDED, DEAD, REFUSED = "new", "open", "streaming", "ended", "dead", "refused"
WORKERS = 3
SCHEDULE_SHOWN = 40
# The audit re-reads every account and generation: it runs every AUDIT_EVERY steps (or
# every 1% of a longer run) and at the end, while the per-step checks cover the same
# balances for the simulated accounts.
AUDIT_EVERY = 100
# Retries of an Idempotency-Key come this soon after its last claim, inside the 24 hours
# a claim is kept (app.generations.idempotency.REPLAY_WINDOW).
KEY_RETRIES_WITHIN = timedelta(hours=23)
# A budget that leaves less than this is spent: less than the smallest requests' holds.
LITTLE = Decimal("0.0002")
# Time waits for windows' ends only this far into a run: on PostgreSQL, every month it
# reaches gives the partitioned tables a partition more.
WAITS_WITHIN = timedelta(days=92).total_seconds()
# Every this many requests is a Messages request passed through whole, untranslated.
NATIVE_EVERY = 8


# How a 402 names each limit the model foretells, and how a hold past it is told.
LIMITS_NAMED = {BALANCE: driver.BALANCE, KEY: driver.KEY_BUDGET, MEMBER: driver.MEMBER_BUDGET}
PASSED = {
    BALANCE: "the available balance",
    KEY: "its key's budget",
    MEMBER: "its member's budget",
}


def refusal_named(outcome: driver.Shortage | int) -> str:
    """How the schedule tells a refusal: its status, and a 402's limit."""
    if isinstance(outcome, int):
        return str(outcome)
    if outcome.limit == driver.BALANCE:
        return "402 by the balance"
    if outcome.limit == driver.DEBT:
        return f"402, in debt (${outcome.left})"
    return f"402 by the {outcome.limit}'s {outcome.window} budget"


class SimulationFailure(AssertionError):
    """An invariant broke: the message says the seed, the step and how to replay it."""


@dataclass(frozen=True)
class Faults:
    """Which faults a run injects beyond the ordinary ones (failures, hang-ups, deaths).

    All are on by default; turning one off narrows a replay down to the others.
    """

    # The upstream reports more usage than the hold covers.
    overuse: bool = True
    # A key is deleted while one of its requests is still running.
    delete_keys_in_flight: bool = True
    # A caller reads its stream slower than the upstream writes: the gateway does not
    # pull, so no read timeout ends the request however long it stalls.
    slow_callers: bool = True
    # A monthly limit is put on a key while requests it admitted without one still run.
    limit_keys_in_flight: bool = True
    # A member's budget is set or changed while requests of their keys still run.
    budget_members_in_flight: bool = True


@dataclass
class SimKey:
    """A key as the simulator knows it: its current value and the values it had."""

    name: str
    id: int
    value: str
    state: str = ACTIVE
    old_values: list[str] = field(default_factory=list)
    budget: Decimal | None = None
    member_id: int | None = None


@dataclass
class SimAccount:
    """An account of the simulation, by its index in the schedule."""

    index: int
    id: int
    email: str
    keys: list[SimKey] = field(default_factory=list)
    grant_keys: dict[str, Decimal] = field(default_factory=dict)
    # The organisation's current members by id, its owner first; all pay from its balance.
    members: list[int] = field(default_factory=list)
    # How many members it ever had: the next one is named after it.
    joined: int = 0


@dataclass
class SimRequest:
    """One request's state machine: new, open (held), streaming, then ended, dead or refused."""

    number: int
    account: SimAccount
    key: SimKey
    model: Any
    stream: bool
    max_tokens: int
    script: UpstreamScript
    worker: int
    state: str = NEW
    generation: Any = None
    chunks: Iterator[dict[str, Any]] | None = None
    delivered: int = 0
    told_cost: Decimal | None = None
    # When its upstream's read timeout fails it, unless a chunk arrives first.
    deadline: float = 0.0
    slow_caller: bool = False
    # A whole request sent with an Idempotency-Key: its claim, when it was made, the
    # answer to store under it, and whether it was stored.
    idempotency_key: str | None = None
    claim: Any = None
    claimed_at: float = 0.0
    answer: dict[str, Any] | None = None
    stored: bool = False
    # What its worker last recorded of what the stream delivered (its usage), and when
    # a dead request's hold was found ended and its settlement checked.
    recorded: Usage | None = None
    recorded_delivered: int = 0
    # Whether the upstream had ended the generation (its last chunk came) when its
    # progress was last recorded: then nothing can have gone out since.
    recorded_ended: bool = False
    death_checked: bool = False
    # A relayed stream: whether its upstream's last event came (Messages' message_delta,
    # Responses' response.completed), its usage complete.
    upstream_ended: bool = False
    # A Responses request passed through: the body its upstream is sent.
    forwarded: dict[str, Any] | None = None
    # A Responses API request: whether it is stored, the response it continues, and its
    # place in the conversation (the door's Turn).
    api: str = "chat"
    store: bool = False
    previous: str | None = None
    turn: Any = None
    # A request passed through: the body sent as it is, and what it may be billed for
    # beyond tokens (its web searches).
    body: dict[str, Any] | None = None
    surcharges: Any = None
    # The service tier a request passed through asks for (None: the upstream's standard).
    tier: str | None = None
    # The prompt tokens its hold was sized by: the prompt's bound, or its count when the
    # bound did not fit. An estimate of its usage never counts the prompt lower.
    held_prompt: int = 0

    @property
    def name(self) -> str:
        """How the schedule names it."""
        kind = "stream" if self.stream else "whole"
        return f"r{self.number} ({self.api} {kind} {self.model.id} {self.key.name})"


class Simulation:
    """One seeded run against the app's database."""

    def __init__(
        self,
        app: Flask,
        monkeypatch: pytest.MonkeyPatch,
        *,
        seed: int,
        steps: int,
        faults: Faults = Faults(),
        schedule_file: Path | None = None,
    ) -> None:
        self.app, self.seed, self.steps, self.faults = app, seed, steps, faults
        self.schedule_file = schedule_file
        self.random = random.Random(seed)
        self.clock = driver.SimulatedClock(START)
        driver.install_clock(monkeypatch, self.clock)
        self.processes = driver.Workers(monkeypatch)
        self.adapter = SimulatedAdapter()
        self.models = driver.simulated_models(self.adapter)
        self.native_adapter = SimulatedNativeAdapter()
        self.native_model = driver.native_model(self.native_adapter)
        # What the passed-through requests' bodies and upstream answer hold is drawn from
        # a generator of its own, so that they leave the rest of the schedule as it was.
        self.native_random = random.Random(f"passed through {seed}")
        # Apart, so that the tiers drawn change none of the other draws.
        self.tier_random = random.Random(f"tiers {seed}")
        self.ttl = int(app.config["HOLD_TTL_SECONDS"])
        self.read_timeout = self.adapter.upstream.read_timeout
        self.sweep_every = driver.sweep_period(self.ttl)
        self.next_sweep_at = self.sweep_every
        self.accounts: list[SimAccount] = []
        self.requests: list[SimRequest] = []
        self.live: list[SimRequest] = []
        self.hold_owners: dict[str, SimRequest] = {}
        # The generations charged less than their price: the audit must report just these.
        self.shortfalls: set[str] = set()
        self.workers = list(range(WORKERS))
        self.schedule: list[str] = []
        self.step = 0
        # How far each key or member is past its budget: only changing the budget may raise it.
        self.excess: dict[str, Decimal] = {}
        self.audit_every = max(AUDIT_EVERY, steps // 100)
        # The key's or member's counters whose budget this step changed.
        self.budget_changed: Counters | None = None
        # The simulator's own account of every key's and member's budget and counters.
        self.budgets = BudgetModel()
        # A budget's counters whose window the callers wait to end, and when it ends.
        self.waiting: tuple[Counters, datetime] | None = None
        # Each Idempotency-Key's requests, in the order they ran under it.
        self.keyed: dict[str, list[SimRequest]] = {}
        # Whole answers charged whose worker has not stored them under their key yet.
        self.unstored: list[SimRequest] = []
        # The generations charged from a dead stream's last recorded progress.
        self.interrupted: set[str] = set()
        # Stored responses: (account index, response id, when it was stored).
        self.stored: list[tuple[int, str, float]] = []
        # The response each stored one continued (None: it began its conversation).
        self.continued: dict[str, str | None] = {}
        # Each account's head, balance and last ledger entry, as a step's check found them sound.
        self.chains_checked: dict[int, tuple[Any, ...]] = {}

    def run(self) -> None:
        """Run the schedule, then drain it; raise SimulationFailure at the first violation."""
        with self.app.app_context():
            driver.add_months()
            self.open_accounts()
            while self.step < self.steps:
                self.step += 1
                self.perform(self.choose_action())
            self.drain()

    def open_accounts(self) -> None:
        """Three accounts with little money, so that requests compete for it."""
        for index in range(3):
            # Not drawn from self.random: a replay must not find the first run's accounts.
            email = f"sim-{self.seed}-{index}-{uuid.uuid4().hex[:12]}@example.com"
            credits = self.money(Decimal("0.002"), Decimal("0.03"))
            account = SimAccount(index, driver.open_account(email, credits), email)
            self.join(account, driver.owner_of(account.id))
            self.accounts.append(account)
            for _ in range(2):
                self.issue_key(account)

    def money(self, low: Decimal, high: Decimal) -> Decimal:
        """A random amount of USD between ``low`` and ``high``, to the cent's ten-thousandth."""
        units = self.random.randint(int(low * 1_000_000), int(high * 1_000_000))
        return Decimal(units) / 1_000_000

    def choose_action(self) -> Callable[[], str]:
        """Pick the next action, weighted, among those possible now."""
        actions: list[tuple[Callable[[], str], int]] = [
            (self.start_request, 20),
            (self.pass_time, 8),
            (self.jump_time, 2),
            (self.sweep, 2),
            (self.grant, 4),
            (self.change_key, 4),
            (self.change_limit, 3),
            (self.add_member, 2),
            (self.change_member_budget, 3),
        ]
        budgeted, _, members = self.members_who_may_leave()
        if members:
            # Often while a member with a budget has requests running.
            actions.append((self.remove_member, 4 if budgeted else 1))
        if self.live:
            actions += [(self.advance, 45), (self.kill_worker, 1)]
        elif self.clock.elapsed < WAITS_WITHIN:
            actions.append((self.await_window, 3))
        if any(r.chunks is not None for r in self.live):
            actions += [(self.hang_up, 4), (self.record_progress, 6)]
        if self.retriable_keys():
            actions.append((self.retry, 3))
        if self.unstored:
            actions.append((self.store_answer, 4))
        if self.unswept_deaths():
            actions.append((self.await_expiry, 4))
        choices, weights = zip(*actions, strict=True)
        return self.random.choices(choices, weights)[0]

    def perform(self, action: Callable[[], str], *, audit: bool = False) -> None:
        """Run one step and check every invariant after it."""
        try:
            description = action()
        except SimulationFailure:
            raise
        except Exception as error:
            driver.reset_session()
            self.fail([f"{action.__name__} raised {error!r}", traceback.format_exc()])
        self.schedule.append(f"{self.step}: {description}")
        self.check_invariants(audit=audit or self.step % self.audit_every == 0)
        self.budget_changed = None

    def fail(self, problems: list[str]) -> None:
        """Stop the run with the seed, the step, the problems and the schedule."""
        shown = self.schedule[-SCHEDULE_SHOWN:]
        lines = [
            f"simulation failed: seed {self.seed}, step {self.step} of {self.steps}",
            *(f"  {problem}" for problem in problems),
            f"replay: pytest tests/simulation --seed {self.seed} --steps {self.step}",
        ]
        if self.schedule_file is not None:
            self.schedule_file.write_text("\n".join(self.schedule) + "\n")
            lines.append(f"whole schedule: {self.schedule_file}")
        lines.append(f"schedule (last {len(shown)} of {len(self.schedule)} steps):")
        self.abandon_live_requests()
        raise SimulationFailure("\n".join(lines + shown))

    def abandon_live_requests(self) -> None:
        """Stop a failed run's requests where they are, so that none settles later."""
        for request in self.live:
            driver.bury(request.generation)
            request.chunks = None

    # Requests.

    def start_request(self) -> str:
        """A caller sends a request with one of its account's keys (maybe a stale one).

        A third of the whole requests carry an Idempotency-Key, claimed before they run.
        """
        model = self.random.choice(self.models)
        max_tokens = self.random.choice([16, 64, 256, 1024])
        if returning := self.returning_caller():
            # A caller whose budget ran out tries a small request first.
            (account, key), model, max_tokens = returning, self.models[0], 256
            value, expected = key.value, None
        else:
            account = self.random.choice(self.accounts)
            key, value, expected = self.pick_key(account)
        stream = self.random.random() < 0.6
        request = self.new_request(account, key, model, stream=stream, max_tokens=max_tokens)
        if request.number % NATIVE_EVERY == 0:
            return self.start_native(request, value, expected)
        if self.random.random() < 0.35:
            return self.start_response(request, value, expected)
        if not stream and self.random.random() < 0.35:
            request.idempotency_key = f"idem-{request.number}"
            self.keyed[request.idempotency_key] = [request]
            claimed = self.claim(request)
            if claimed.kind != driver.CLAIMED:
                self.fail([f"{request.name}: a new Idempotency-Key was {claimed.kind}"])
        described = self.launch(request, value, expected)
        return f"start {request.name} max_tokens={max_tokens}: {described}"

    def start_response(self, request: SimRequest, value: str, expected: int | None) -> str:
        """The request comes through the Responses API: stored or not, continuing or not.

        It continues one of its account's stored responses, or now and then another
        account's, which must be refused as not found, as must one past its time.
        """
        request.api, request.store = "responses", self.random.random() < 0.7
        own = [entry for entry in self.stored if entry[0] == request.account.index]
        others = [entry for entry in self.stored if entry[0] != request.account.index]
        roll = self.random.random()
        if own and roll < 0.5:
            request.previous = self.random.choice(own)[1]
        elif others and roll > 0.85:
            request.previous = self.random.choice(others)[1]
        if expected is None and request.previous is not None and not self.continuable(request):
            expected = driver.NOT_FOUND
        body = driver.response_body(
            request.number,
            request.model,
            stream=request.stream,
            max_tokens=request.max_tokens,
            store=request.store,
            previous=request.previous,
        )
        forecast = self.forecast(request) if expected is None else None
        outcome = self.processes.start_response(
            request.worker, value, request.model, body, self.clock, self.ttl
        )
        if isinstance(outcome, tuple):
            outcome, request.turn = outcome
        described = self.started(request, outcome, expected, forecast)
        return f"start {request.name} max_tokens={request.max_tokens}: {described}"

    def start_native(self, request: SimRequest, value: str, expected: int | None) -> str:
        """The request is a Messages one, passed through to an upstream that serves them.

        Most of its prompt sits in a ``search_result`` block, which only the body's
        counting reads; the upstream answers with cache reads, writes of both TTLs and web
        searches, which its charge must price at the catalog's rates. Half of those with
        some text to send are streamed, the upstream's events relayed as they come; half
        of the streams are Responses requests instead (start_native_response).
        """
        draw = self.native_random
        request.api, request.model = "native", self.native_model
        searches = draw.randint(1, 3)
        request.tier = "priority" if self.tier_random.random() < 0.4 else None
        request.stream = draw.random() < 0.5 and bool(request.script.chunk_tokens)
        if request.stream and draw.random() < 0.5:
            return self.start_native_response(request, value, expected)
        request.body = driver.native_body(
            request.number,
            request.model,
            max_tokens=request.max_tokens,
            found=draw.randint(20, 600),
            searches=searches,
            tier=request.tier,
            stream=request.stream,
        )
        counted, request.surcharges = driver.native_terms(request.body, request.model)
        script = request.script
        script.prompt_estimate, script.bound_factor = counted, 1
        self.native_adapter.scripts[request.number] = script
        self.native_adapter.split[request.number] = self.native_split(searches)
        forecast = self.forecast(request) if expected is None else None
        outcome = self.processes.start_native(
            request.worker, value, request.model, request.body, self.clock, self.ttl
        )
        described = self.started(request, outcome, expected, forecast)
        return f"start {request.name} max_tokens={request.max_tokens}: {described}"

    def start_native_response(self, request: SimRequest, value: str, expected: int | None) -> str:
        """The request is a streamed Responses one, passed through, not stored.

        Its upstream's events are relayed as they come; only its last one reports the
        usage: the prompt it read, with its cache reads.
        """
        request.api, request.tier = "native-responses", None
        request.body = driver.native_response_body(
            request.number, request.model, max_tokens=request.max_tokens
        )
        counted, request.surcharges = driver.native_response_terms(
            request.body, request.model, request.account.id
        )
        script = request.script
        script.prompt_estimate, script.bound_factor = counted, 1
        self.native_adapter.scripts[request.number] = script
        self.native_adapter.split[request.number] = self.native_split(0)
        forecast = self.forecast(request) if expected is None else None
        outcome = self.processes.start_native_response(
            request.worker, value, request.model, request.body, self.clock, self.ttl
        )
        if isinstance(outcome, tuple):
            outcome, request.turn, request.forwarded = outcome
        described = self.started(request, outcome, expected, forecast)
        return f"start {request.name} max_tokens={request.max_tokens}: {described}"

    def native_split(self, searches: int) -> NativeUsage:
        """How the upstream splits a prompt it reads (of at least 20 words) and its searches."""
        draw = self.native_random
        return NativeUsage(
            cache_read=draw.choice([0, 0, 4]),
            write_5m=draw.choice([0, 5, 7]),
            write_1h=draw.choice([0, 3, 9]),
            web_searches=draw.randint(0, searches),
        )

    def continuable(self, request: SimRequest) -> bool:
        """Whether the response the request continues is its account's and still kept.

        Every response before it in its conversation must be kept too: each expires in
        its own time, the earliest first.
        """
        kept = {response_id: (index, stored_at) for index, response_id, stored_at in self.stored}
        response_id = request.previous
        while response_id is not None:
            account_index, stored_at = kept[response_id]
            alive = self.clock.elapsed < stored_at + driver.RESPONSES_TTL_SECONDS
            if account_index != request.account.index or not alive:
                return False
            response_id = self.continued[response_id]
        return True

    def new_request(
        self, account: SimAccount, key: SimKey, model: Any, *, stream: bool, max_tokens: int
    ) -> SimRequest:
        """A request of ``account`` with ``key``, its upstream's script written."""
        request = SimRequest(
            number=len(self.requests) + 1,
            account=account,
            key=key,
            model=model,
            stream=stream,
            max_tokens=max_tokens,
            script=self.write_script(max_tokens),
            worker=self.random.choice(self.workers),
        )
        self.requests.append(request)
        self.adapter.scripts[request.number] = request.script
        return request

    def claim(self, request: SimRequest) -> Any:
        """Claim the request's Idempotency-Key, as the view's decorator does first."""
        claimed = driver.claim_key(request.account.id, request.idempotency_key, self.ttl)
        if claimed.kind == driver.CLAIMED:
            request.claim, request.claimed_at = claimed.claim, self.clock.elapsed
        return claimed

    def launch(self, request: SimRequest, value: str, expected: int | None) -> str:
        """Start the request in its worker, under its claim's generation id if it has one."""
        chat = driver.chat_request(
            request.number, request.model, stream=request.stream, max_tokens=request.max_tokens
        )
        generation_id = None if request.claim is None else request.claim.generation_id
        forecast = self.forecast(request) if expected is None else None
        outcome = self.processes.start(
            request.worker, value, request.model, chat, self.clock, self.ttl, generation_id
        )
        described = self.started(request, outcome, expected, forecast)
        if request.claim is not None and request.state == REFUSED:
            driver.release_claim(request.claim)
        return described

    def forecast(self, request: SimRequest) -> Forecast:
        """What the request's hold must come to, by the model's budgets and the balance.

        It is sized by the prompt's bound, then by its count; on the way, the account's
        holds past their expiry whose requests recorded no progress are released.
        """
        script, now = request.script, self.clock.now()
        bound, counted = (
            driver.worst_case(
                request.model,
                prompt_tokens=tokens,
                max_tokens=request.max_tokens,
                surcharges=request.surcharges or driver.NO_SURCHARGES,
            )
            for tokens in (script.prompt_bound, script.prompt_estimate)
        )
        account_id = request.account.id
        state = driver.account_states([account_id])[account_id]
        holds = driver.open_holds([account_id])
        driver.end_reads()
        expired = [
            hold.id
            for hold in holds
            if hold.expires_at < now
            and (owner := self.hold_owners.get(hold.id)) is not None
            and owner.recorded is None
        ]
        available = state.balance - state.reserved
        return self.budgets.expect_hold(request.key.id, (bound, counted), available, expired, now)

    def started(
        self, request: SimRequest, outcome: Any, expected: int | None, forecast: Forecast | None
    ) -> str:
        """Record how the start went; check it held or refused as foretold."""
        if isinstance(outcome, int | driver.Shortage):
            request.state = REFUSED
            self.check_refusal(request, outcome, expected, forecast)
            return f"refused {refusal_named(outcome)}"
        if expected is not None:
            self.fail([f"{request.name} was served with a key that should get {expected}"])
        request.state, request.generation = OPEN, outcome
        request.slow_caller = (
            request.stream and self.faults.slow_callers and self.random.random() < 0.3
        )
        request.deadline = self.deadline(request)
        hold_id, amount = driver.hold_of(outcome)
        self.hold_owners[hold_id] = request
        self.live.append(request)
        self.check_held(request, amount, forecast)
        script = request.script
        sized_by_bound = forecast.resized_by is None
        request.held_prompt = script.prompt_bound if sized_by_bound else script.prompt_estimate
        self.budgets.hold(hold_id, request.key.id, amount, self.clock.now())
        return f"held ${amount}"

    def check_held(self, request: SimRequest, amount: Decimal, forecast: Forecast) -> None:
        """A hold was placed: it must be the one foretold, not one some limit refuses.

        A hold larger than foretold passed the limit that should have sized it down.
        """
        passed = forecast.refused_by
        if passed is None and amount > forecast.amount:
            passed = forecast.resized_by
        if passed is not None:
            expected = f"a hold of ${forecast.amount}, sized by the prompt's count"
            if forecast.refused_by is not None:
                expected = f"a 402 with ${forecast.amount} asked and ${forecast.left} left"
            self.fail([f"{request.name} was held ${amount}, past {PASSED[passed]}: {expected}"])
        if amount != forecast.amount:
            self.fail([f"{request.name} was held ${amount}, expected ${forecast.amount}"])

    def check_refusal(
        self, request: SimRequest, outcome: Any, expected: int | None, forecast: Forecast | None
    ) -> None:
        """A refusal must match the key's state; a 402 must be foretold, naming its limit.

        It names the first limit the hold does not fit (the balance, the key's budget,
        the member's), with what was asked and what that limit leaves.
        """
        if expected is not None:
            status = outcome if isinstance(outcome, int) else outcome.status
            if status != expected:
                self.fail([f"{request.name} refused {status}, expected {expected}"])
            return
        if forecast.refused_by is None:
            self.fail(
                [
                    f"{request.name} refused {refusal_named(outcome)}: {outcome}, "
                    f"expected a hold of ${forecast.amount}"
                ]
            )
        told = driver.Shortage(
            LIMITS_NAMED[forecast.refused_by],
            forecast.amount,
            forecast.left,
            forecast.budget,
            forecast.window,
        )
        if outcome != told:
            self.fail([f"{request.name} refused {outcome}, expected {told}"])

    def returning_caller(self) -> tuple[SimAccount, SimKey] | None:
        """The account and active key of a caller who waited for their budget's window to end.

        Once it has: the first request after it finds what was spent before it gone.
        """
        if self.waiting is None or self.clock.now() < self.waiting[1]:
            return None
        counters, self.waiting = self.waiting[0], None
        theirs = [
            (account, key)
            for account in self.accounts
            for key in account.keys
            if key.state == ACTIVE and counters in self.budgets.limits(key.id)
        ]
        return self.random.choice(theirs) if theirs else None

    def pick_key(self, account: SimAccount) -> tuple[SimKey, str, int | None]:
        """A key value to call with, and the refusal it must get (None: it is valid).

        Mostly an active key of one of the members who have one, each member as often.
        """
        active = [k for k in account.keys if k.state == ACTIVE]
        if active and self.random.random() < 0.9:
            member_id = self.random.choice(sorted({k.member_id for k in active}))
            key = self.random.choice([k for k in active if k.member_id == member_id])
            return key, key.value, None
        candidates: list[tuple[SimKey, str, int | None]] = []
        for key in account.keys:
            expected = {ACTIVE: None, REVOKED: driver.REVOKED, DELETED: driver.UNAUTHORIZED}
            candidates.append((key, key.value, expected[key.state]))
            candidates += [(key, old, driver.UNAUTHORIZED) for old in key.old_values]
        return self.random.choice(candidates)

    def write_script(self, max_tokens: int) -> UpstreamScript:
        """Decide what the upstream will do: chunks, usage, failures, overuse."""
        prompt = self.random.randint(5, 400)
        chunks, total = [], 0
        for _ in range(self.random.choice([0, 1, 2, 3, 5, 8])):
            tokens = self.random.randint(1, max(1, max_tokens // 4))
            if total + tokens > max_tokens:
                break
            chunks.append(tokens)
            total += tokens
        reported = self.reported_usage(prompt, total, max_tokens)
        fail_before = None
        if self.random.random() < 0.12:
            fail_before = self.random.randint(0, len(chunks))
        early = None
        if reported is not None and self.random.random() < 0.2:
            early = reported.prompt_tokens
        return UpstreamScript(prompt, chunks, reported, early, fail_before)

    def reported_usage(self, prompt: int, completion: int, max_tokens: int) -> Usage | None:
        """The usage the upstream will report: its own counts, none, or more than held."""
        roll = self.random.random()
        if roll < 0.15:
            return None
        # The gateway's prompt estimate is an upper bound of the upstream's count.
        counted = max(1, prompt - self.random.randint(0, 3))
        if self.faults.overuse and roll > 0.9:
            counted = prompt * 2
            completion = max_tokens + self.random.randint(1, 2 * max_tokens)
        cached = self.random.choice([0, 0, counted // 2])
        return Usage(prompt_tokens=counted, completion_tokens=completion, cached_tokens=cached)

    def advance(self) -> str:
        """Move one live request one step: the next chunk, or the whole answer."""
        request = self.random.choice(self.live)
        return self.advance_request(request)

    def advance_request(self, request: SimRequest) -> str:
        """Pull the request's next chunk (or run it whole), then check it if it ended."""
        cap = self.charge_cap(request)
        if not request.stream:
            return self.complete_whole(request, cap)
        if request.chunks is None:
            if request.forwarded is not None:
                request.chunks = driver.open_native_response_stream(
                    request.generation, request.turn, request.forwarded
                )
            elif request.turn is not None:
                request.chunks = driver.open_response_stream(request.generation, request.turn)
            elif request.body is not None:
                request.chunks = driver.open_native_stream(request.generation, request.body)
            else:
                request.chunks = driver.open_stream(request.generation)
            request.state = STREAMING
        try:
            send = next(request.chunks)
        except StopIteration:
            return self.end(request, cap, completed=True, how="stream ended")
        except UpstreamError:
            return self.end(request, cap, completed=False, how="upstream broke off")
        finally:
            if request.body is not None:
                self.check_sent(request)
        return self.received(request, send, cap)

    def received(self, request: SimRequest, send: list[dict[str, Any]], cap: Decimal) -> str:
        """Count what the caller got; a cost told means the stream has settled."""
        delivered = driver.delivered_tokens(send)
        if request.recorded is None and request.body is not None:
            # A relayed stream's progress is recorded before its first read goes out,
            # with the usage that read brought (message_start's; none in Responses').
            request.recorded = self.native_start_usage(request)
        elif request.recorded is None and delivered:
            # Recorded before its first output went out: the prompt's early count, if any.
            early = request.script.early_prompt
            request.recorded = Usage() if early is None else Usage(prompt_tokens=early)
        if driver.ends_generation(send):
            request.upstream_ended = True
        request.delivered += delivered
        request.told_cost = driver.send_cost(send)
        if request.told_cost is not None:
            return self.end(request, cap, completed=True, how="usage chunk")
        request.deadline = self.deadline(request)
        return f"chunk of {request.name}, {request.delivered} tokens delivered"

    def complete_whole(self, request: SimRequest, cap: Decimal) -> str:
        """Run a non-streamed request to its answer or its failure.

        A failed request gives its Idempotency-Key's claim back; an answer is stored under
        it at once, or by a later step of its worker (which may die first).
        """
        try:
            if request.body is not None:
                body = self.relay_whole(request)
            elif request.turn is not None:
                body = driver.complete_response(request.generation, request.turn)
            else:
                body = driver.complete(request.generation)
        except UpstreamError:
            if request.claim is not None:
                driver.release_claim(request.claim)
            return self.end(request, cap, completed=False, how="upstream failed")
        request.told_cost = driver.body_cost(body)
        request.delivered = request.script.completion_tokens
        described = self.end(request, cap, completed=True, how="answered")
        if request.claim is not None:
            request.answer = body
            if self.random.random() < 0.7:
                self.store(request)
            else:
                self.unstored.append(request)
        return described

    def relay_whole(self, request: SimRequest) -> dict[str, Any]:
        """Pass the request through; what its upstream was sent must be paid for by its hold.

        The worst case of what the upstream read (its prompt, by its own count, and the
        ``max_tokens`` and searches it was allowed) never passes the hold: the hold is what
        the balance and the budgets were found to pay.
        """
        try:
            return driver.relay_whole(request.generation, request.body)
        finally:
            self.check_sent(request)

    def check_sent(self, request: SimRequest) -> None:
        """The worst case of what the request's upstream was sent is within its hold."""
        script = request.script
        if script.sent_prompt is None:
            return
        worst = driver.worst_case(
            request.model,
            prompt_tokens=script.sent_prompt,
            max_tokens=script.sent_max_tokens,
            surcharges=request.surcharges,
        )
        _, held = driver.hold_of(request.generation)
        if worst > held:
            self.fail(
                [
                    f"{request.name}: its upstream was sent {script.sent_prompt} prompt tokens "
                    f"and max_tokens {script.sent_max_tokens}, worth up to ${worst}, past its "
                    f"hold of ${held} (the prompt counted {script.prompt_estimate} tokens)"
                ]
            )

    def store(self, request: SimRequest) -> None:
        """Store the request's whole answer under its Idempotency-Key."""
        driver.store_answer(request.claim, request.answer)
        request.stored = True

    def store_answer(self) -> str:
        """A worker stores a whole answer it charged under its Idempotency-Key."""
        request = self.random.choice(self.unstored)
        self.unstored.remove(request)
        self.store(request)
        return f"store the answer of {request.name} under {request.idempotency_key}"

    def retry(self) -> str:
        """A caller sends a request again with its Idempotency-Key.

        It is replayed, refused as in progress or as charged with its answer lost, or run
        anew when its last run charged nothing and holds nothing, never charged twice.
        """
        key = self.random.choice(self.retriable_keys())
        last = self.keyed[key][-1]
        expected = self.expected_claim(last)
        claimed = driver.claim_key(last.account.id, key, self.ttl)
        problems = []
        if claimed.kind != expected:
            problems.append(f"retry of {key} after {last.name} ({last.state}): {claimed.kind}")
        elif expected == driver.ANSWER_LOST and claimed.generation_id != last.generation.id:
            problems.append(f"retry of {key} names {claimed.generation_id}, not {last.name}")
        if problems:
            self.fail([*problems, f"expected {expected}"])
        if claimed.kind != driver.CLAIMED:
            return f"retry {key}: {claimed.kind}"
        return f"retry {key}: " + self.run_again(last, claimed)

    def retriable_keys(self) -> list[str]:
        """The keys whose last claim is well within the 24 hours a key is kept for.

        A key past them is pruned and may be used anew (and charged anew): its promise
        of one charge holds within those 24 hours.
        """
        horizon = self.clock.elapsed - KEY_RETRIES_WITHIN.total_seconds()
        return sorted(key for key, runs in self.keyed.items() if runs[-1].claimed_at > horizon)

    def expected_claim(self, last: SimRequest) -> str:
        """What a retry of the key that ``last`` ran under must get."""
        if last.stored:
            return driver.REPLAYED
        if last.state in (OPEN, STREAMING):
            return driver.IN_PROGRESS
        if last.state == ENDED:
            charged = sum(driver.settlement(last.generation.id).charges)
            driver.end_reads()
            # An answer, or a charge, means the request ran: its claim stays used.
            return driver.ANSWER_LOST if charged or last.answer is not None else driver.CLAIMED
        if last.state == DEAD:
            hold_open = driver.hold_is_open(driver.hold_of(last.generation)[0])
            driver.end_reads()
            young = self.clock.elapsed - last.claimed_at <= self.ttl
            return driver.IN_PROGRESS if hold_open or young else driver.CLAIMED
        return driver.CLAIMED  # refused: its claim was given back

    def run_again(self, last: SimRequest, claimed: Any) -> str:
        """Run the key's request anew, as its caller's retry does once it holds the claim."""
        expected = {ACTIVE: None, REVOKED: driver.REVOKED, DELETED: driver.UNAUTHORIZED}
        request = self.new_request(
            last.account, last.key, last.model, stream=False, max_tokens=last.max_tokens
        )
        request.idempotency_key = last.idempotency_key
        request.claim, request.claimed_at = claimed.claim, self.clock.elapsed
        self.keyed[request.idempotency_key].append(request)
        described = self.launch(request, last.key.value, expected[last.key.state])
        return f"{request.name} runs it anew: {described}"

    def hang_up(self) -> str:
        """A caller of a running stream goes away: the server closes its generator."""
        request = self.random.choice([r for r in self.live if r.chunks is not None])
        cap = self.charge_cap(request)
        driver.close_stream(request.chunks)
        return self.end(request, cap, completed=False, how="caller hung up")

    def kill_worker(self) -> str:
        """A worker dies: its requests vanish without settling; a new worker takes its place.

        The whole answers it charged but had not stored under their key are lost with it.
        """
        worker = self.random.choice(self.workers)
        victims = [r for r in self.live if r.worker == worker]
        self.processes.kill(worker, [r.generation for r in victims])
        for request in victims:
            request.chunks = None
            request.state = DEAD
            self.live.remove(request)
        lost = [r for r in self.unstored if r.worker == worker]
        self.unstored = [r for r in self.unstored if r.worker != worker]
        self.workers[self.workers.index(worker)] = max(self.workers) + 1
        return f"worker {worker} died with {[r.number for r in victims]}, answers {len(lost)}"

    def record_progress(self) -> str:
        """A worker records what each of its streams delivered since its last record."""
        worker = self.random.choice(self.workers)
        return self.progress_tick(worker)

    def progress_tick(self, worker: int) -> str:
        """``worker`` records its streams' progress; it must be what the callers received."""
        recorded = self.processes.record_progress(self.app, worker)
        expected = []
        for request in self.live:
            fresh = request.delivered > request.recorded_delivered
            if request.worker == worker and request.chunks is not None and fresh:
                request.recorded = self.expected_usage(request, completed=False)
                request.recorded_delivered = request.delivered
                request.recorded_ended = self.generation_ended(request)
                expected.append(request.number)
        if recorded != len(expected):
            self.fail([f"worker {worker} recorded {recorded} streams, expected {expected}"])
        return f"worker {worker} recorded the progress of {expected}" if expected else ""

    def check_dead_requests(self) -> None:
        """A dead request whose hold ended was charged its last recorded progress, or nothing.

        Its charge is the price of that progress, as far as the account and key allowed:
        the rest is the record's shortfall.
        """
        for request in self.requests:
            if request.state != DEAD or request.death_checked:
                continue
            hold_id, _ = driver.hold_of(request.generation)
            if driver.hold_is_open(hold_id):
                continue
            request.death_checked = True
            settled = driver.settlement(driver.generation_id(request.generation))
            driver.end_reads()
            problems = self.death_problems(request, settled)
            if problems:
                self.fail([f"{request.name} died: {problem}" for problem in problems])
            if request.recorded is None:
                self.budgets.release(hold_id)
            else:
                self.budgets.settle(hold_id, sum(settled.charges, Decimal(0)), self.clock.now())

    def generation_ended(self, request: SimRequest) -> bool:
        """Whether the upstream ended the stream's generation: no more output can follow.

        A chat chunk ends it with its finish reason, which comes with the last text; a
        relayed stream with its last event (message_delta, response.completed).
        """
        if request.body is not None:
            return request.upstream_ended
        return request.delivered == request.script.completion_tokens

    def dead_usage(self, request: SimRequest) -> Usage:
        """What a dead stream is billed for: its progress, if its upstream had ended it.

        Else what went out since its last record is unknown: its output is billed at the
        request's limit, its prompt at the upstream's early count or the hold's, a relayed
        stream's web searches at the most its request allowed.
        """
        usage = request.recorded
        if request.recorded_ended:
            return usage
        limit = request.generation.request.max_output_tokens or request.model.max_output_tokens
        if request.body is not None:
            calls = dict(usage.tool_calls or {})
            for tool, allowed in request.surcharges.tool_calls.items():
                calls[tool] = max(calls.get(tool, 0), allowed)
            return replace(
                usage,
                prompt_tokens=usage.prompt_tokens or request.held_prompt,
                completion_tokens=max(usage.completion_tokens, limit),
                tool_calls=calls or None,
            )
        return Usage(
            prompt_tokens=usage.prompt_tokens or request.held_prompt,
            completion_tokens=max(usage.completion_tokens, limit),
            cached_tokens=usage.cached_tokens,
        )

    def death_problems(self, request: SimRequest, settled: driver.Settlement) -> list[str]:
        """What is wrong with the settlement of a dead request's ended hold."""
        if request.recorded is None:
            if settled.records or settled.charges:
                return [f"nothing was recorded, yet {settled}"]
            return []
        usage, generation_id = self.dead_usage(request), driver.generation_id(request.generation)
        price = driver.price(usage, request.model)
        if len(settled.records) != 1 or settled.statuses != ["interrupted"]:
            return [f"recorded progress {usage}, settled as {settled}"]
        tokens, cost = tuple(settled.records[0][:3]), settled.records[0][3]
        self.interrupted.add(generation_id)
        if settled.shortfalls[0]:
            self.shortfalls.add(generation_id)
        problems = []
        if tokens != (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens):
            problems.append(f"charged for tokens {tokens}, its progress was {usage}")
        if cost + settled.shortfalls[0] != price:
            problems.append(f"cost ${cost} + shortfall ${settled.shortfalls[0]} != ${price}")
        if sum(settled.charges) != cost or len(settled.charges) != (cost > 0):
            problems.append(f"charged {settled.charges}, its record says ${cost}")
        return problems

    def charge_cap(self, request: SimRequest) -> Decimal:
        """What may be charged for this request if it settles in the next step.

        Its hold if still open, and beyond it what the account has available and the
        budgets of its key and its member still allow, as the model has them.
        """
        hold_id, amount = driver.hold_of(request.generation)
        state = driver.account_states([request.account.id])[request.account.id]
        driver.end_reads()
        room = max(state.balance - state.reserved, Decimal(0))
        allowance = self.budgets.room(request.key.id, self.clock.now())
        held = amount if self.budgets.holds[hold_id].open else Decimal(0)
        return held + (room if allowance is None else min(room, allowance))

    def end(self, request: SimRequest, cap: Decimal, *, completed: bool, how: str) -> str:
        """The request is over: it must be settled once, at the price of what it delivered."""
        request.state = ENDED
        if request.chunks is not None:
            # The server closes the response's iterator once it is done with it.
            driver.close_stream(request.chunks)
            request.chunks = None
        self.live.remove(request)
        usage = self.expected_usage(request, completed)
        price = driver.price(usage, request.model)
        expected = min(price, cap)
        if expected < price:
            self.shortfalls.add(driver.generation_id(request.generation))
        self.check_settlement(request, usage, expected, shortfall=price - expected)
        self.budgets.settle(driver.hold_of(request.generation)[0], expected, self.clock.now())
        if request.turn is not None:
            self.check_stored(request, completed=completed)
        return f"{how}: {request.name}, {request.delivered} tokens, charged ${expected}"

    def check_stored(self, request: SimRequest, *, completed: bool) -> None:
        """A response is stored when it was asked to be and was answered, for its account only.

        Stored, it tells the cost its caller was told, and later requests may continue it.
        """
        response_id = driver.generation_id(request.generation)
        found = driver.stored_cost(request.account.id, response_id)
        others = [a for a in self.accounts if a is not request.account]
        seen_by_others = [a.index for a in others if driver.stored_cost(a.id, response_id)]
        driver.end_reads()
        problems = []
        if completed and request.store:
            if found is None or found != request.told_cost:
                problems.append(f"stored cost {found}, told the caller {request.told_cost}")
            self.stored.append((request.account.index, response_id, self.clock.elapsed))
            self.continued[response_id] = request.previous
        elif found is not None:
            problems.append("a response stored though it should not be")
        if seen_by_others:
            problems.append(f"its stored response found by accounts {seen_by_others}")
        if problems:
            self.fail([f"{request.name}: {problem}" for problem in problems])

    def expected_usage(self, request: SimRequest, completed: bool) -> Usage:
        """What the request is billed for: the upstream's count, or what was delivered."""
        script = request.script
        if completed and request.body is not None:
            return self.native_usage(request)
        if request.body is not None:
            return self.relayed_usage(request)
        if completed and script.reported is not None:
            return script.reported
        if request.delivered == 0:
            return Usage()
        prompt = request.held_prompt if script.early_prompt is None else script.early_prompt
        if completed and not request.stream:
            # The simulated upstream's adapter counts a whole answer's usage itself.
            prompt = script.prompt_estimate
        return Usage(prompt_tokens=prompt, completion_tokens=request.delivered)

    def relayed_usage(self, request: SimRequest) -> Usage:
        """What a relayed stream that did not reach its end is billed for.

        The upstream's usage as it last came (message_start's, then message_delta's), its
        output never below the delivered text's count; nothing when nothing was delivered.
        """
        if request.delivered == 0:
            return Usage()
        ended = request.upstream_ended
        came = self.native_usage(request) if ended else self.native_start_usage(request)
        if came.prompt_tokens == 0:
            # No usage came yet (a Responses stream's is in its last event): the hold's.
            came = replace(came, prompt_tokens=request.held_prompt)
        completion = max(came.completion_tokens, request.delivered)
        return replace(came, completion_tokens=completion)

    def native_start_usage(self, request: SimRequest) -> Usage:
        """The usage a relayed stream's first read brings.

        Messages' message_start's (the prompt, one output token); none in Responses'
        ``response.created``.
        """
        if request.forwarded is not None:
            return Usage()
        return replace(self.native_usage(request), completion_tokens=1, tool_calls=None)

    def native_usage(self, request: SimRequest) -> Usage:
        """What a passed-through request's upstream reported, in the gateway's terms."""
        split = self.native_adapter.split[request.number]
        if request.forwarded is not None:
            return Usage(
                prompt_tokens=request.script.sent_prompt,
                completion_tokens=request.script.completion_tokens,
                cached_tokens=split.cache_read,
            )
        return Usage(
            prompt_tokens=request.script.sent_prompt,
            completion_tokens=request.script.completion_tokens,
            cached_tokens=split.cache_read,
            cache_write_tokens=split.write_5m + split.write_1h,
            cache_write_1h_tokens=split.write_1h,
            tool_calls={"web_search": split.web_searches} if split.web_searches else None,
            service_tier=request.tier or "standard",
        )

    def check_settlement(
        self, request: SimRequest, usage: Usage, expected: Decimal, *, shortfall: Decimal
    ) -> None:
        """One record and at most one charge, of the expected amount, as the caller was told.

        What could not be charged is the record's shortfall.
        """
        settled = driver.settlement(driver.generation_id(request.generation))
        driver.end_reads()
        problems = []
        if len(settled.records) != 1:
            problems.append(f"{len(settled.records)} generation records")
        elif tuple(settled.records[0][:3]) != (
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_tokens,
        ):
            problems.append(f"recorded tokens {tuple(settled.records[0][:3])}, expected {usage}")
        elif settled.records[0][3] != expected:
            problems.append(f"recorded cost ${settled.records[0][3]}, expected ${expected}")
        elif settled.shortfalls[0] != shortfall:
            problems.append(f"recorded shortfall ${settled.shortfalls[0]}, expected ${shortfall}")
        if sum(settled.charges) != expected or len(settled.charges) != (expected > 0):
            problems.append(f"charged {settled.charges}, expected ${expected} once")
        if request.told_cost is not None and request.told_cost != expected:
            problems.append(f"told the caller ${request.told_cost}, expected ${expected}")
        if problems:
            self.fail([f"{request.name}: {problem}" for problem in problems])

    # Time, the sweeper and the operator.

    def pass_time(self) -> str:
        """A few seconds pass (an upstream's latency, a pause between chunks)."""
        seconds = round(self.random.expovariate(1 / 5), 3)
        return self.let_time_pass(seconds)

    def jump_time(self) -> str:
        """Time jumps past the holds' TTL, as it does for a stalled or dead worker."""
        seconds = round(self.ttl * self.random.uniform(0.5, 2.5), 3)
        return self.let_time_pass(seconds)

    def await_window(self) -> str:
        """Nothing runs: time goes on to about the end of a window, as over a quiet night.

        To a little before or after the end of the day, or of the window a key's or a
        member's budget is in, most often one spent, so that the requests to come run
        across it; a caller of the spent budget then comes back (``returning_caller``).
        """
        now = self.clock.now()
        ends, spent = self.budgets.window_ends(now), self.budgets.spent_ends(now, LITTLE)
        counters, end = self.random.choice(spent if spent and self.random.random() < 0.7 else ends)
        seconds = max((end - now).total_seconds() + self.random.uniform(-60, 60), 0)
        passed = self.let_time_pass(round(seconds, 3))
        # The sweepers give the tables partitioned by month their months ahead.
        driver.add_months()
        if counters is None:
            return f"await the end of the day: {passed}"
        self.waiting = (counters, end)
        return f"await the end of {counters.name}'s {counters.window}: {passed}"

    def await_expiry(self) -> str:
        """Time goes on to just past a dead request's hold's expiry, before the next sweep.

        Until the sweepers come round, the next hold on its account that does not fit
        releases it first, as every hold past its expiry without progress.
        """
        now = self.clock.now()
        expiries = {h.id: h.expires_at for h in driver.open_holds([a.id for a in self.accounts])}
        driver.end_reads()
        coming = [
            (request, expires_at)
            for request in self.unswept_deaths()
            if (expires_at := expiries.get(driver.hold_of(request.generation)[0], now)) > now
        ]
        if not coming:
            return "no dead request's hold is left to expire"
        request, expires_at = self.random.choice(coming)
        seconds = (expires_at - now).total_seconds() + self.random.uniform(0.001, 5)
        passed = self.let_time_pass(round(seconds, 3))
        return f"await the expiry of {request.name}'s hold: {passed}"

    def unswept_deaths(self) -> list[SimRequest]:
        """The dead requests without progress recorded whose holds may still be open."""
        return [
            r
            for r in self.requests
            if r.state == DEAD and r.recorded is None and not r.death_checked
        ]

    def let_time_pass(self, seconds: float) -> str:
        """Advance the clock through what happens meanwhile, in time order.

        Each worker's sweeper runs whenever its period comes; a live request whose
        upstream stays silent past its read timeout fails then, as through ``requests``.
        The sweeps that would find nothing to do (nothing runs, no hold is open) are
        passed over, so that days may pass.
        """
        target = self.clock.elapsed + seconds
        events = []
        while (event := self.next_event()) is not None and event[0] <= target:
            if self.idle():
                self.pass_over_sweeps(target)
                continue
            self.clock.elapsed, request = event
            events.append(self.time_out(request) if request else self.run_due_sweep())
        self.clock.elapsed = target
        happened = "; ".join(e for e in events if e)
        return f"{seconds}s pass" + (f": {happened}" if happened else "")

    def idle(self) -> bool:
        """Whether nothing runs and no dead request's hold is left to end."""
        dead = (r for r in self.requests if r.state == DEAD)
        return not self.live and all(r.death_checked for r in dead)

    def pass_over_sweeps(self, target: float) -> None:
        """Let the sweeps due until ``target`` go by: while idle, they change nothing."""
        periods = math.floor((target - self.next_sweep_at) / self.sweep_every) + 1
        self.next_sweep_at += max(periods, 0) * self.sweep_every

    def deadline(self, request: SimRequest | None = None) -> float:
        """When a request now waiting on its upstream times out (a slow caller's never)."""
        if request is not None and request.slow_caller:
            return math.inf
        return self.clock.elapsed + self.read_timeout

    def next_event(self) -> tuple[float, SimRequest | None] | None:
        """The next timed event: the sweeper's period, or an upstream's read timeout."""
        event: tuple[float, SimRequest | None] = (self.next_sweep_at, None)
        for request in self.live:
            if request.deadline < event[0]:
                event = (request.deadline, request)
        return event

    def run_due_sweep(self) -> str:
        """The sweepers' periodic run, after each worker's record of its streams' progress."""
        self.next_sweep_at += self.sweep_every
        ticks = [self.progress_tick(worker) for worker in self.workers]
        ended = self.processes.sweep(self.app, self.workers)
        self.check_dead_requests()
        happened = [tick for tick in ticks if tick]
        if ended:
            happened.append(f"sweep ended {ended} holds")
        return "; ".join(happened)

    def time_out(self, request: SimRequest) -> str:
        """The request's upstream has been silent too long: its next read fails."""
        request.script.timed_out = True
        return self.advance_request(request)

    def sweep(self) -> str:
        """One worker's sweeper runs now, off the others' period."""
        worker = self.random.choice(self.workers)
        self.progress_tick(worker)
        ended = self.processes.sweep(self.app, [worker])
        self.check_dead_requests()
        return f"worker {worker}'s sweeper ended {ended} holds"

    def grant(self) -> str:
        """The operator grants credits, sometimes repeating an idempotency key."""
        account = self.random.choice(self.accounts)
        amount = self.money(Decimal("0.0005"), Decimal("0.01"))
        key = None
        if account.grant_keys and self.random.random() < 0.3:
            key = self.random.choice(sorted(account.grant_keys))
            amount = account.grant_keys[key]
        elif self.random.random() < 0.3:
            key = f"grant-{self.step}"
        applied = driver.grant(account.id, amount, idempotency_key=key)
        if applied != (key is None or key not in account.grant_keys):
            self.fail([f"grant of ${amount} with key {key} applied={applied}"])
        if key is not None:
            account.grant_keys[key] = amount
        return f"grant ${amount} to a{account.index} (key {key}): applied={applied}"

    def change_key(self) -> str:
        """The account's owner issues, rotates, revokes or deletes a key."""
        account = self.random.choice(self.accounts)
        kept = [k for k in account.keys if k.state != DELETED]
        change = self.random.choice(["issue", "rotate", "revoke", "delete"])
        if change == "issue" or not kept:
            return f"issue key {self.issue_key(account).name}"
        key = self.random.choice(kept)
        if change == "rotate":
            key.old_values.append(key.value)
            key.value = driver.rotate_key(key.id)
        elif change == "revoke":
            driver.revoke_key(key.id)
            key.state = REVOKED
        elif self.faults.delete_keys_in_flight or not self.in_flight(key):
            driver.delete_key(key.id)
            key.state = DELETED
        else:
            return f"keep key {key.name}: a request made with it is running"
        return f"{change} key {key.name}"

    def issue_key(self, account: SimAccount, member_id: int | None = None) -> SimKey:
        """Issue a new key to ``member_id``, or to one of the account's members."""
        member_id = member_id or self.random.choice(account.members)
        key = SimKey(
            f"k{account.index}.{len(account.keys)}",
            *driver.issue_key(account.id, member_id),
            member_id=member_id,
        )
        account.keys.append(key)
        self.budgets.add_key(key.id, member_id, key.name)
        return key

    def join(self, account: SimAccount, member_id: int) -> str:
        """``member_id`` joins the account's members; return the name the schedule gives them."""
        name = f"m{account.index}.{account.joined}"
        account.joined += 1
        account.members.append(member_id)
        self.budgets.add_member(member_id, name)
        return name

    def add_member(self) -> str:
        """An organisation gains a member, who is issued a key at once."""
        account = self.random.choice(self.accounts)
        email = f"member-{self.seed}-{self.step}-{uuid.uuid4().hex[:8]}@example.com"
        member_id = driver.add_member(account.id, email)
        name = self.join(account, member_id)
        key = self.issue_key(account, member_id)
        return f"a{account.index} gains member {name} with key {key.name}"

    def remove_member(self) -> str:
        """An organisation loses a member: their keys are revoked at once.

        Most often one whose requests are running, and among those one with a budget:
        the requests go on and are charged, as with any revoked key, and count against
        the member's budget as they settle; the invariants check the keys refuse from now.
        """
        account, member_id = self.leaving_member()
        revoked = driver.remove_member(account.id, member_id)
        theirs = [k for k in account.keys if k.member_id == member_id and k.state == ACTIVE]
        if revoked != len(theirs):
            self.fail([f"removing a member revoked {revoked} keys, not {len(theirs)}"])
        for key in theirs:
            key.state = REVOKED
        account.members.remove(member_id)
        member = self.budgets.members[member_id]
        running = sum(1 for r in self.live if r.key.member_id == member_id)
        return (
            f"a{account.index} removes member {member.name} (budget ${member.budget} a "
            f"{member.window}, {running} requests running): {revoked} keys revoked"
        )

    def members_who_may_leave(self) -> list[list[tuple[SimAccount, int]]]:
        """The members but owners who may leave, in three groups, the narrowest first.

        Those with a budget and requests running, those with requests running, all.
        """
        members = [(a, m) for a in self.accounts for m in a.members[1:]]
        running = [(a, m) for a, m in members if any(r.key.member_id == m for r in self.live)]
        budgeted = [(a, m) for a, m in running if self.budgets.members[m].budget is not None]
        return [budgeted, running, members]

    def leaving_member(self) -> tuple[SimAccount, int]:
        """A member who leaves: most often one with a budget and requests running."""
        roll = self.random.random()
        for group, chance in zip(self.members_who_may_leave(), (0.8, 0.9, 1), strict=True):
            if group and roll < chance:
                return self.random.choice(group)
        raise AssertionError("no member but owners may leave")

    def change_limit(self) -> str:
        """The owner sets, changes or lifts a key's budget, in one of the windows."""
        keys = [k for account in self.accounts for k in account.keys if k.state != DELETED]
        key = self.random.choice(keys)
        limit = None
        if self.random.random() < 0.8:
            limit = self.money(Decimal("0.0005"), Decimal("0.02"))
        if not self.faults.limit_keys_in_flight and self.in_flight(key):
            return f"keep the limit of key {key.name}: a request made with it is running"
        window = self.random.choice(WINDOWS)
        driver.set_budget(key.id, limit, window)
        self.budgets.set_key_budget(key.id, limit, window, self.clock.now())
        key.budget = limit
        self.budget_changed = self.budgets.keys[key.id]
        return f"limit key {key.name} to ${limit} a {window}"

    def change_member_budget(self) -> str:
        """An admin sets, changes or lifts a member's budget, in one of the windows.

        Every key of the member counts against it, those with a budget of their own too.
        Half the time the member is one whose requests are running, if there is one.
        """
        running = sorted({r.key.member_id for r in self.live if r.key.member_id is not None})
        if running and self.random.random() < 0.5:
            member_id = self.random.choice(running)
        else:
            member_id = self.random.choice(self.random.choice(self.accounts).members)
        member = self.budgets.members[member_id]
        amount = None
        if self.random.random() < 0.8:
            amount = self.money(Decimal("0.001"), Decimal("0.03"))
        window = self.random.choice(WINDOWS)
        running = any(r.key.member_id == member_id for r in self.live)
        if running and not self.faults.budget_members_in_flight:
            return f"keep the budget of member {member.name}: a request of theirs is running"
        driver.set_member_budget(member_id, amount, window)
        self.budgets.set_member_budget(member_id, amount, window, self.clock.now())
        self.budget_changed = member
        return f"budget member {member.name} ${amount} a {window}"

    def in_flight(self, key: SimKey) -> bool:
        """Whether a live request was made with ``key``."""
        return any(r.key is key for r in self.live)

    # Invariants.

    def check_invariants(self, *, audit: bool) -> None:
        """Balances, holds and hash chains after every step; the audit when ``audit``."""
        ids = [account.id for account in self.accounts]
        problems = list(self.balance_problems(driver.account_states(ids)))
        holds = driver.open_holds(ids)
        problems += self.hold_problems(holds)
        problems += self.budget_problems(holds)
        driver.end_reads()
        problems += driver.chain_problems(ids, self.chains_checked)
        if audit and not problems:
            problems += self.audit_problems(ids)
        if problems:
            self.fail(problems)

    def audit_problems(self, account_ids: list[int]) -> list[str]:
        """What ``flask ledger audit`` finds wrong with the simulation's accounts and requests.

        It must report as shortfalls exactly the generations charged less than their price.
        """
        started = [r.generation for r in self.requests if r.generation is not None]
        audit = driver.audit(account_ids, map(driver.generation_id, started))
        problems = list(audit.mismatches)
        if audit.shortfalls != self.shortfalls:
            problems.append(
                f"the audit reports shortfalls of {sorted(audit.shortfalls)}, "
                f"expected {sorted(self.shortfalls)}"
            )
        if audit.estimated != self.interrupted:
            problems.append(
                f"the audit reports estimated charges of {sorted(audit.estimated)}, "
                f"expected {sorted(self.interrupted)}"
            )
        return problems + list(self.idempotency_problems())

    def idempotency_problems(self) -> Iterator[str]:
        """No Idempotency-Key was charged for more than one of its requests."""
        for key, requests in self.keyed.items():
            charged = []
            for request in requests:
                if request.generation is not None:
                    settled = driver.settlement(driver.generation_id(request.generation))
                    if sum(settled.charges):
                        charged.append(request.name)
            driver.end_reads()
            if len(charged) > 1:
                yield f"Idempotency-Key {key} was charged for {charged}"

    def balance_problems(self, states: dict[int, driver.AccountState]) -> Iterator[str]:
        """Each balance is its ledger, each reserve its holds; nothing available below zero."""
        for account in self.accounts:
            state = states[account.id]
            name = f"a{account.index}"
            if state.balance != state.ledger_sum:
                yield f"{name}: balance ${state.balance}, its ledger sums to ${state.ledger_sum}"
            if state.reserved != state.open_holds_sum:
                yield f"{name}: reserved ${state.reserved}, open holds ${state.open_holds_sum}"
            if state.balance - state.reserved < 0:
                yield f"{name}: available ${state.balance - state.reserved} is below zero"

    def hold_problems(self, holds: list[driver.OpenHold]) -> Iterator[str]:
        """A hold is open only while its request lives, or until its bound after a death."""
        now = self.clock.now()
        bound = timedelta(seconds=self.sweep_every)
        for hold in holds:
            owner = self.hold_owners.get(hold.id)
            if owner is None:
                yield f"open hold {hold.id} of ${hold.amount} belongs to no request"
            elif owner.state == ENDED:
                yield f"{owner.name} ended but its hold of ${hold.amount} is open"
            elif owner.state == DEAD and now > hold.expires_at + bound:
                yield f"{owner.name} died; its hold outlived its expiry by more than {bound}"
        still_open = {hold.id for hold in holds}
        for request in self.live:
            if driver.hold_of(request.generation)[0] not in still_open:
                yield f"{request.name} is running but its hold is no longer open"

    def budget_problems(self, holds: list[driver.OpenHold]) -> Iterator[str]:
        """Every key's and member's row: as the model has it, and never past its budget.

        Its reservation is its open holds (a member's, those of all their keys); a row
        never goes further past its budget than a change of the budget took it. Deleted
        keys and removed members too: their rows stay, and their requests still settle.
        """
        rows = driver.budget_rows(list(self.budgets.keys), list(self.budgets.members))
        held = self.held_on_budgets(holds)
        for found, modelled in zip(rows, (self.budgets.keys, self.budgets.members), strict=True):
            for row_id, counters in modelled.items():
                yield from self.row_problems(found[row_id], counters, held[counters.name])

    def held_on_budgets(self, holds: list[driver.OpenHold]) -> dict[str, Decimal]:
        """What the open holds reserve on each key and each member, by their names."""
        held = {
            c.name: Decimal(0)
            for c in [*self.budgets.keys.values(), *self.budgets.members.values()]
        }
        for hold in holds:
            if hold.id in self.budgets.holds:
                for counters in self.budgets.reserved_by(hold.id):
                    held[counters.name] += hold.amount
        return held

    def row_problems(
        self, row: driver.BudgetRow, counters: Counters, held: Decimal
    ) -> Iterator[str]:
        """What is wrong with one key's or member's row."""
        name, now = counters.name, self.clock.now()
        # As of now: a calendar window that ended counts nothing, whether a settlement
        # (at its own time) or a hold has rolled the row over yet.
        modelled = driver.BudgetRow(
            counters.budget, counters.window, *counters.as_of(now), counters.reserved
        )
        found = Counters(name, row.budget, row.window, row.start, row.spent, row.reserved)
        row = driver.BudgetRow(row.budget, row.window, *found.as_of(now), row.reserved)
        if row != modelled:
            yield f"{name}: its row has {row}, the model {modelled}"
        if row.reserved != held:
            yield f"{name}: reserved ${row.reserved}, its open holds ${held}"
        if row.budget is None:
            return
        spent = driver.spent_in_window(row, self.clock.now())
        excess = max(spent + held - row.budget, Decimal(0))
        if excess > self.excess.get(name, Decimal(0)) and counters is not self.budget_changed:
            yield (
                f"{name}: spent ${spent} this {row.window} and holds ${held}, "
                f"past its budget of ${row.budget}"
            )
        self.excess[name] = excess

    def drain(self) -> None:
        """Finish every live request, let every dead one's hold expire; nothing may stay open."""
        while self.live:
            self.step += 1
            request = self.live[0]
            self.perform(lambda request=request: self.advance_request(request))
        while self.unstored:
            self.step += 1
            self.perform(self.store_answer)
        self.step += 1
        self.perform(lambda: self.let_time_pass(self.ttl + 2 * self.sweep_every), audit=True)
        holds = driver.open_holds([account.id for account in self.accounts])
        driver.end_reads()
        if holds:
            self.fail([f"{len(holds)} holds still open after every request ended"])
        for request in self.requests:
            if request.state == ENDED:
                self.check_still_settled_once(request)
            if request.state == DEAD and not request.death_checked:
                self.fail([f"{request.name} died and its hold's end was never checked"])

    def check_still_settled_once(self, request: SimRequest) -> None:
        """Nothing that ran after a request ended may have charged it again."""
        settled = driver.settlement(driver.generation_id(request.generation))
        driver.end_reads()
        if len(settled.records) != 1 or sum(settled.charges) != settled.records[0][3]:
            self.fail([f"{request.name} ended with {settled}"])
