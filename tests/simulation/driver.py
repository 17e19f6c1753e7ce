"""The simulation's one coupling to the domain API: every call into app/ goes through here.

When the money path's functions change shape, this module changes and the simulator
does not. Each function is one thing a worker, the sweeper or an operator does, or one
read of the database's truth for the invariants.

Every third request comes in by Anthropic's Messages door, the others by Chat
Completions: its body is parsed and translated by that door, and its answer and events
encoded by it, so that the door's streams settle as the chat ones must.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import bindparam, false, func, select, true, type_coerce

from app import budgets, sweeper
from app.accounts import budgets as budget_admin
from app.accounts import keys as key_admin
from app.accounts import members
from app.accounts.invites import accept_invite
from app.accounts.models import MEMBER
from app.accounts.organisations import create_account, owner_membership
from app.auth import keys
from app.auth.models import ACTIVE, ApiKey
from app.catalog.pricing import Pricing, cost_of, worst_case_cost
from app.catalog.registry import Model
from app.completions.bodies import chunk_bodies, completion_body
from app.credits import ledger, statements
from app.credits.errors import InsufficientCredits
from app.credits.models import Account, Hold, LedgerEntry
from app.database import Money
from app.encoding import dumps
from app.extensions import db
from app.generations import audit as audit_module
from app.generations import idempotency, retention
from app.generations import lifecycle as generations
from app.generations.audit import audit_ledger
from app.generations.lifecycle import Generation
from app.generations.models import CHAT, MESSAGES, RESPONSES
from app.generations.models import Generation as GenerationRecord
from app.messages.schemas import parse_messages_request
from app.messages.translation import StreamTranslation as MessagesStream
from app.messages.translation import chat_request as translated_request
from app.messages.translation import message_of
from app.providers.base import ChatRequest, Route, RouteTarget, Usage
from app.responses import conversation as response_conversation
from app.responses import store as response_store
from app.responses.bodies import EventWriter
from app.responses.conversation import Turn
from app.responses.errors import ResponseNotFound
from app.responses.ids import new_response_id
from app.responses.models import StoredResponse
from app.responses.schemas import parse_response_request
from app.responses.translation import StreamTranslation as ResponsesStream
from app.responses.translation import check_output_limit, response_events
from app.sweeper import (
    LiveHolds,
    record_stream_progress,
    renew_live_holds,
    sweep_expired_holds,
    sweep_interval,
)
from tests.simulation.upstream import SCRIPT_FIELD, SimulatedAdapter

UNAUTHORIZED, REVOKED, INSUFFICIENT, NOT_FOUND = 401, 403, 402, 404
# How long a stored response is kept (the default of RESPONSES_TTL_DAYS), in seconds.
RESPONSES_TTL_DAYS = 30
RESPONSES_TTL_SECONDS = RESPONSES_TTL_DAYS * 24 * 3600
# Models priced far apart, so that holds, charges and shortfalls differ by model.
PRICES = {
    "sim-mini": ("0.15", "0.60", "0.075"),
    "sim-chat": ("0.50", "1.50", "0.05"),
    "sim-large": ("3", "15", "0.30"),
}


class SimulatedClock:
    """The time every domain function reads while the simulation runs.

    Only the simulator moves it, by setting ``elapsed`` to the next event's time.
    """

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.elapsed = 0.0

    def now(self) -> datetime:
        """The simulated wall clock, aware UTC."""
        return self.start + timedelta(seconds=self.elapsed)

    def monotonic(self) -> float:
        """Simulated seconds since the start."""
        return self.elapsed

    def time(self) -> float:
        """The simulated wall clock as a POSIX timestamp."""
        return self.now().timestamp()


def install_clock(monkeypatch: pytest.MonkeyPatch, clock: SimulatedClock) -> None:
    """Make the money path, keys, claims, stored responses, audit and pruning read ``clock``."""
    for module in (
        ledger,
        generations,
        budget_admin,
        idempotency,
        response_store,
        audit_module,
        retention,
    ):
        monkeypatch.setattr(module, "utcnow", clock.now)
    monkeypatch.setattr(
        generations, "time", SimpleNamespace(monotonic=clock.monotonic, time=clock.time)
    )


class Workers:
    """The simulated gunicorn workers' memories: each one's registry of live holds.

    It stands in for the process-wide ``live_holds`` the generation lifecycle tracks its
    holds in, and files each hold under the worker that started its request. A worker that
    dies loses its registry with the rest of its memory, so its holds are renewed no more.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.registries: dict[int, LiveHolds] = {}
        self.serving: int | None = None
        monkeypatch.setattr(generations, "live_holds", self)

    def registry(self, worker: int) -> LiveHolds:
        """The live holds of ``worker`` (a new worker starts with none)."""
        return self.registries.setdefault(worker, LiveHolds())

    def track(self, hold_id: str, owner: object) -> None:
        """Renew ``hold_id`` in the registry of the worker now starting a request."""
        assert self.serving is not None, "a hold was placed outside a worker"
        self.registry(self.serving).track(hold_id, owner)

    def forget(self, hold_id: str) -> None:
        """Stop renewing ``hold_id``: its request settled, in whichever worker ran it."""
        for registry in self.registries.values():
            registry.forget(hold_id)

    def start(
        self,
        worker: int,
        key_value: str,
        model: Model,
        request: ChatRequest,
        clock: SimulatedClock,
        ttl: int,
        generation_id: str | None = None,
    ) -> Generation | int:
        """``start`` the request in ``worker``, which renews its hold from then on."""
        self.serving = worker
        try:
            return start(key_value, model, request, clock, ttl, generation_id)
        finally:
            self.serving = None

    def start_response(
        self,
        worker: int,
        key_value: str,
        model: Model,
        body: dict[str, Any],
        clock: SimulatedClock,
        ttl: int,
    ) -> tuple[Generation, Turn] | int:
        """``start_response`` in ``worker``, which renews its hold from then on."""
        self.serving = worker
        try:
            return start_response(key_value, model, body, clock, ttl)
        finally:
            self.serving = None

    def kill(self, worker: int, running: Iterable[Generation]) -> None:
        """The worker died with ``running``: none settles, none of their holds is renewed."""
        for generation in running:
            bury(generation)
        self.registries.pop(worker, None)

    def record_progress(self, app: Flask, worker: int) -> int:
        """``worker`` records what its streams delivered since last time; return how many."""
        return record_stream_progress(app, self.registry(worker))

    def sweep(self, app: Flask, workers: Iterable[int]) -> int:
        """The sweepers of ``workers`` run: each renews its live holds, then expired ones go.

        Returns how many holds were released.
        """
        for worker in workers:
            renew_live_holds(app, self.registry(worker))
        return sweep_expired_holds(app)


def simulated_models(adapter: SimulatedAdapter) -> list[Model]:
    """The models the simulated upstream serves, at PRICES."""
    models = []
    for model_id, (prompt, completion, cached) in PRICES.items():
        target = RouteTarget(upstream_model=model_id, max_output_tokens=1024)
        models.append(
            Model(
                id=model_id,
                owned_by="simulation",
                context_length=8192,
                max_output_tokens=1024,
                capabilities=frozenset(),
                pricing=Pricing(
                    prompt=Decimal(prompt),
                    completion=Decimal(completion),
                    cached_read=Decimal(cached),
                    image=Decimal(0),
                ),
                routes=(Route(adapter=adapter, target=target),),
            )
        )
    return models


def price(usage: Usage, model: Model) -> Decimal:
    """What ``usage`` costs at the model's catalog prices."""
    return cost_of(usage, model.pricing)


def worst_case(model: Model, *, prompt_tokens: int, max_tokens: int) -> Decimal:
    """The most a request can cost: what its hold must cover."""
    return worst_case_cost(
        prompt_tokens=prompt_tokens, completion_tokens=max_tokens, pricing=model.pricing
    )


def sweep_period(ttl: int) -> float:
    """Seconds between two runs of a worker's sweeper."""
    return sweep_interval(ttl)


def open_account(email: str, credits: Decimal) -> int:
    """Create an account with ``credits``; return its id."""
    account = create_account(email=email)
    grant(account.id, credits, idempotency_key=None)
    return account.id


def grant(account_id: int, amount: Decimal, *, idempotency_key: str | None) -> bool:
    """Grant ``amount``; return whether it was applied (not a repeat of its key)."""
    _, applied = ledger.grant_credits(
        account_id=account_id, amount=amount, idempotency_key=idempotency_key
    )
    return applied


def owner_of(account_id: int) -> int:
    """Return the membership id of the account's owner."""
    return owner_membership(account_id).id


def add_member(account_id: int, email: str) -> int:
    """Invite ``email`` as a member, who accepts with a new password; return the member id."""
    token = members.invite_member(account_id, members.OPERATOR, email=email, role=MEMBER)
    accept_invite(token, "simulated member password")
    return members.find_member_by_email(account_id, email).id


def remove_member(account_id: int, member_id: int) -> int:
    """Remove the member (their keys are revoked at once); return how many keys were."""
    return members.remove_member(account_id, members.OPERATOR, member_id)


def issue_key(account_id: int, member_id: int | None = None) -> tuple[int, str]:
    """Issue a key for the account's member (its owner by default); return its id and value."""
    issued = key_admin.create_key(account_id=account_id, member_id=member_id, name="simulated")
    return issued.id, issued.value


def rotate_key(key_id: int) -> str:
    """Give the key a new value; return it."""
    return key_admin.rotate_key(key_id).value


def revoke_key(key_id: int) -> None:
    """Revoke the key."""
    key_admin.revoke_key(key_id)


def delete_key(key_id: int) -> None:
    """Delete the key."""
    key_admin.delete_key(key_id)


def set_budget(key_id: int, amount: Decimal | None, window: str) -> None:
    """Set (or with None, lift) the key's budget of ``amount`` a ``window``."""
    budget_admin.set_key_budget(key_id, amount=amount, window=window)


def api_of(number: int) -> str:
    """The front door simulated request ``number`` comes in by."""
    return MESSAGES if number % 3 == 0 else CHAT


def chat_request(number: int, model: Model, *, stream: bool, max_tokens: int) -> ChatRequest:
    """The request of simulated request ``number``, which the upstream plays by its script.

    A Messages request is the normalized request its door translates its body into.
    """
    content = f"simulated request {number}"
    if api_of(number) == MESSAGES:
        body = {
            "model": model.id,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": content}],
            "stream": stream,
            SCRIPT_FIELD: number,
        }
        return translated_request(parse_messages_request(body), model)
    return ChatRequest(
        model=model.id,
        messages=[{"role": "user", "content": content}],
        params={"max_tokens": max_tokens},
        stream=stream,
        include_usage=stream and number % 2 == 0,
        extra={SCRIPT_FIELD: number},
    )


def start(
    key_value: str,
    model: Model,
    request: ChatRequest,
    clock: SimulatedClock,
    ttl: int,
    generation_id: str | None = None,
) -> Generation | int:
    """Authenticate as the view does and hold the worst case; or return the refusal's status."""
    caller = keys.find_caller(key_value)
    if caller is None or caller.state != ACTIVE:
        db.session.rollback()
        return UNAUTHORIZED if caller is None else REVOKED
    try:
        generation = generations.start_generation(
            caller=caller,
            model=model,
            request=request,
            hold_ttl_seconds=ttl,
            generation_id=generation_id,
            api=api_of(request.extra[SCRIPT_FIELD]),
        )
    except InsufficientCredits:
        db.session.rollback()
        return INSUFFICIENT
    # The lifecycle's own timestamps must come from the simulated clock too.
    generation.started = clock.monotonic()
    return generation


def response_body(
    number: int,
    model: Model,
    *,
    stream: bool,
    max_tokens: int,
    store: bool,
    previous: str | None,
) -> dict[str, Any]:
    """The Responses API body of simulated request ``number``, continuing ``previous``."""
    body = {
        "model": model.id,
        "input": f"simulated request {number}",
        "max_output_tokens": max_tokens,
        "stream": stream,
        "store": store,
        SCRIPT_FIELD: number,
    }
    if previous is not None:
        body["previous_response_id"] = previous
    return body


def start_response(
    key_value: str, model: Model, body: dict[str, Any], clock: SimulatedClock, ttl: int
) -> tuple[Generation, Turn] | int:
    """Start a Responses API request as its door does; or return the refusal's status.

    The door's own steps: the body parsed, the chain it continues read, the items
    translated into the chat request the generation runs.
    """
    caller = keys.find_caller(key_value)
    if caller is None or caller.state != ACTIVE:
        db.session.rollback()
        return UNAUTHORIZED if caller is None else REVOKED
    request = parse_response_request(body)
    check_output_limit(request, model)
    try:
        turn = Turn(
            request,
            account_id=caller.account_id,
            response_id=new_response_id(),
            ttl_days=RESPONSES_TTL_DAYS,
        )
        generation = generations.start_generation(
            caller=caller,
            model=model,
            request=turn.chat_request(),
            hold_ttl_seconds=ttl,
            generation_id=turn.draft.id,
            api=RESPONSES,
        )
    except ResponseNotFound:
        db.session.rollback()
        return NOT_FOUND
    except InsufficientCredits:
        db.session.rollback()
        return INSUFFICIENT
    generation.started = clock.monotonic()
    return generation, turn


def open_response_stream(generation: Generation, turn: Turn) -> Iterator[list[dict[str, Any]]]:
    """The events of a streamed Responses generation, as the SSE writer sends them.

    The events of one upstream read go out together (up to the core's next None): one
    chunk makes several events, the text's after the item's, in the same send.
    """
    writer = EventWriter(turn.draft)
    translation = ResponsesStream(writer, turn.tools)
    events = response_events(
        writer, translation, generations.stream_generation(generation), turn.finished
    )
    sent: list[dict[str, Any]] = []
    try:
        for chunk in events:
            if chunk is not None:
                sent += chunk
            elif sent:
                yield sent
                sent = []
        if sent:
            yield sent
    finally:
        events.close()


def complete_response(generation: Generation, turn: Turn) -> dict[str, Any]:
    """Run a whole Responses generation; return its Response object (stored if asked)."""
    return turn.answered(generations.run_generation(generation))


def stored_cost(account_id: int, response_id: str) -> Decimal | None:
    """The cost a stored response tells, found as ``account_id`` (None: not found)."""
    stored = response_store.find_stored(account_id, response_id)
    if stored is None:
        return None
    response = json.loads(stored.response, parse_float=Decimal)
    return Decimal(response["usage"]["cost"]["total_cost"])


def open_stream(generation: Generation) -> Iterator[list[dict[str, Any]]]:
    """What the caller of a streamed generation receives, one send at a time.

    Its door's SSE writer sends the bodies between two flush points (the Nones) together:
    a Messages stream's last content block closes in the send that tells its cost, after
    the settlement. Closing this closes the stream.
    """
    items = generations.stream_generation(generation)
    if generation.api == MESSAGES:
        stream = MessagesStream(generation, omitted=False).events(items)
    else:
        stream = chunk_bodies(generation, items)
    try:
        send: list[dict[str, Any]] = []
        for body in stream:
            if body is not None:
                send.append(body)
            elif send:
                yield send
                send = []
        if send:
            yield send
    finally:
        stream.close()


def complete(generation: Generation) -> dict[str, Any]:
    """Run a whole (non-streamed) generation; return its response body."""
    answer = generations.run_generation(generation)
    if generation.api == MESSAGES:
        return message_of(generation, answer, omitted=False)
    return completion_body(generation, answer)


def delivered_tokens(send: list[dict[str, Any]]) -> int:
    """The tokens of content a send brings the caller (the simulated upstream's words)."""
    return sum(_content_tokens(body) for body in send)


def _content_tokens(body: dict[str, Any]) -> int:
    """A chat chunk's content, a Messages text delta, or a Responses text delta, in words."""
    if "choices" in body:
        return sum(len((c["delta"].get("content") or "").split()) for c in body["choices"])
    if body["type"] == "response.output_text.delta":
        return len(body["delta"].split())
    delta = body.get("delta") if body["type"] == "content_block_delta" else None
    return len(delta["text"].split()) if delta and delta["type"] == "text_delta" else 0


def send_cost(send: list[dict[str, Any]]) -> Decimal | None:
    """The cost a send of a stream tells the caller, if one of its bodies tells it.

    A chat chunk or Messages' message_delta tells it in its usage; a Responses stream in
    the response its terminal event carries.
    """
    for body in send:
        told = body.get("response") if body.get("type") in RESPONSES_ENDS else body
        if (cost := body_cost(told)) is not None:
            return cost
    return None


# The events that end a Responses stream, carrying the whole response with its usage.
RESPONSES_ENDS = ("response.completed", "response.incomplete")


def close_stream(stream: Iterator[list[dict[str, Any]]]) -> None:
    """The server closes the stream's generator: the caller went away, or it is done."""
    stream.close()  # type: ignore[attr-defined]


CLAIMED, REPLAYED, IN_PROGRESS, ANSWER_LOST = "claimed", "replayed", "in progress", "answer lost"


@dataclass(frozen=True)
class ClaimOutcome:
    """What claiming an Idempotency-Key gave: a claim to run under, or why not."""

    kind: str
    claim: Any = None
    generation_id: str | None = None


def claim_key(account_id: int, key: str, ttl: int) -> ClaimOutcome:
    """Claim ``key`` as the view's decorator does, for a request whose body is the key's own."""
    try:
        claim = idempotency.claim_key(
            account_id=account_id,
            key=key,
            body_digest=key,
            claim_ttl_seconds=ttl,
            new_generation_id=generations.new_generation_id,
        )
    except idempotency.IdempotentAnswerLost as lost:
        return ClaimOutcome(ANSWER_LOST, generation_id=lost.generation_id)
    except idempotency.IdempotencyKeyInUse:
        return ClaimOutcome(IN_PROGRESS)
    kind = CLAIMED if claim.replay is None else REPLAYED
    return ClaimOutcome(kind, claim, claim.generation_id)


def store_answer(claim: Any, body: dict[str, Any]) -> None:
    """Store a whole answer under its claim, as the decorator does after the view."""
    idempotency.store_answer(claim, dumps(body))


def release_claim(claim: Any) -> None:
    """Give the claim back, as the decorator does when its request failed."""
    idempotency.release_claim(claim)


def bury(generation: Generation) -> None:
    """The worker serving ``generation`` died: nothing of it may run again.

    A dead process runs no ``finally``; in this process the abandoned generator would be
    closed when collected, so the generation is marked as if nothing is left to settle.
    """
    generation.settled = True


def body_cost(body: dict[str, Any]) -> Decimal | None:
    """The ``usage.cost.total_cost`` a body tells the caller, if it tells one.

    A whole answer tells it, and so do the chat stream's usage chunk and the Messages
    stream's ``message_delta``.
    """
    usage = body.get("usage")
    return None if usage is None else Decimal(usage["cost"]["total_cost"])


def hold_of(generation: Generation) -> tuple[str, Decimal]:
    """The id and amount of the generation's hold."""
    return generation.hold.id, generation.hold.amount


def generation_id(generation: Generation) -> str:
    """The id the generation is recorded and charged under."""
    return generation.id


def reset_session() -> None:
    """Drop what a failed step left in the session."""
    db.session.rollback()


def end_reads() -> None:
    """End the transaction the invariants' reads ran in (the reads below leave it open)."""
    db.session.commit()


@dataclass(frozen=True)
class AccountState:
    """An account's columns beside the sums they must equal."""

    balance: Decimal
    reserved: Decimal
    ledger_sum: Decimal
    open_holds_sum: Decimal


@dataclass(frozen=True)
class OpenHold:
    """A hold the database says is open."""

    id: str
    account_id: int
    amount: Decimal
    expires_at: datetime


def _sum_of(table: Any, *conditions: Any) -> Any:
    total = select(func.coalesce(func.sum(table.amount), 0)).where(
        table.account_id == Account.id, *conditions
    )
    return total.scalar_subquery()


_ACCOUNT_IDS = bindparam("account_ids", expanding=True)
# Built once: the invariants read these after every step.
_ACCOUNT_STATES = select(
    Account.id,
    Account.balance,
    Account.reserved,
    type_coerce(_sum_of(LedgerEntry), Money()),
    type_coerce(_sum_of(Hold, Hold.status == ledger.OPEN), Money()),
).where(Account.id.in_(_ACCOUNT_IDS))
_OPEN_HOLDS = (
    select(Hold.id, Hold.account_id, Hold.amount, Hold.expires_at)
    .where(Hold.account_id.in_(_ACCOUNT_IDS), Hold.status == ledger.OPEN)
    .order_by(Hold.expires_at)
)


def account_states(account_ids: list[int]) -> dict[int, AccountState]:
    """Each account's balance and reserved, and the sums of its ledger and open holds."""
    rows = db.session.execute(_ACCOUNT_STATES, {"account_ids": account_ids}).all()
    return {account_id: AccountState(*sums) for account_id, *sums in rows}


@dataclass(frozen=True)
class KeyState:
    """A key's row (budget, its window's spend, reservation) beside the sums they must equal.

    ``open_holds_sum`` is what its open holds that reserved on its row hold: a hold
    reserves on a key only while it has a budget (or a rolling window).

    ``charged_in_window`` is what the key's requests held in its current window (worked
    out here from the window's rules, not by the ledger's statements) were charged.
    """

    budget: Decimal | None
    window: str
    window_spent: Decimal
    reserved: Decimal
    open_holds_sum: Decimal
    charged_in_window: Decimal
    # What the key's open holds that did not reserve on its row hold: none of them may
    # run once the key has a budget (setting one takes them over).
    unreserved_sum: Decimal = Decimal(0)

    @property
    def allowance(self) -> Decimal | None:
        """What the key may still hold or be charged in its window (None: no budget)."""
        if self.budget is None:
            return None
        return max(self.budget - self.window_spent - self.reserved, Decimal(0))


_KEY_IDS = bindparam("key_ids", expanding=True)


def _open_on_key(reserved: bool) -> Any:
    """The sum of the key's open holds that reserved on its row (or, False, that did not)."""
    return type_coerce(
        select(func.coalesce(func.sum(Hold.amount), 0))
        .where(
            Hold.api_key_id == ApiKey.id,
            Hold.status == ledger.OPEN,
            Hold.reserved_on_key.is_(true() if reserved else false()),
        )
        .scalar_subquery(),
        Money(),
    )


_KEY_ROWS = select(
    ApiKey.id,
    ApiKey.budget,
    ApiKey.budget_window,
    ApiKey.window_start,
    ApiKey.window_spent,
    ApiKey.window_reserved,
    _open_on_key(True),
    _open_on_key(False),
).where(ApiKey.id.in_(_KEY_IDS))
_KEY_CHARGES = (
    select(Hold.api_key_id, Hold.created_at, LedgerEntry.amount)
    .join(LedgerEntry, LedgerEntry.generation_id == Hold.id)
    .where(Hold.api_key_id.in_(_KEY_IDS), Hold.status != ledger.OPEN, LedgerEntry.kind == "charge")
)


def key_states(key_ids: list[int], now: datetime) -> dict[int, KeyState]:
    """Each key's row, its open holds and what its requests held in its window were charged."""
    charges: dict[int, list[tuple[datetime, Decimal]]] = {key_id: [] for key_id in key_ids}
    for key_id, placed_at, amount in db.session.execute(_KEY_CHARGES, {"key_ids": key_ids}):
        charges[key_id].append((placed_at, -amount))
    states = {}
    rows = db.session.execute(_KEY_ROWS, {"key_ids": key_ids}).all()
    for key_id, budget, window, stored, spent, reserved, held, unreserved in rows:
        start = budgets.current_window_start(window, stored, now)
        since = budgets.from_unix_micros(start)
        charged = sum((c for placed_at, c in charges[key_id] if placed_at >= since), Decimal(0))
        if window in budgets.ROLLING_MICROS and start != stored:
            charged = Decimal(0)  # the next request starts the window: nothing is in it yet
        spent = spent if stored == start else Decimal(0)
        states[key_id] = KeyState(budget, window, spent, reserved, held, charged, unreserved)
    return states


def open_holds(account_ids: list[int]) -> list[OpenHold]:
    """The open holds of the accounts."""
    rows = db.session.execute(_OPEN_HOLDS, {"account_ids": account_ids}).all()
    return [OpenHold(*row) for row in rows]


def hold_is_open(hold_id: str) -> bool:
    """Whether the hold is still open."""
    status = db.session.scalar(select(Hold.status).where(Hold.id == hold_id))
    return status == ledger.OPEN


@dataclass(frozen=True)
class Settlement:
    """What the database holds for one generation: its records and its charges."""

    records: list[Any]
    charges: list[Decimal]
    shortfalls: list[Decimal]
    statuses: list[str]


def settlement(generation_id: str) -> Settlement:
    """The generation records and the charge entries written for ``generation_id``."""
    records = db.session.execute(
        select(
            GenerationRecord.prompt_tokens,
            GenerationRecord.completion_tokens,
            GenerationRecord.cached_tokens,
            GenerationRecord.cost,
            GenerationRecord.shortfall,
            GenerationRecord.status,
        ).where(GenerationRecord.id == generation_id)
    ).all()
    charges = db.session.scalars(
        select(LedgerEntry.amount).where(
            LedgerEntry.generation_id == generation_id, LedgerEntry.kind == ledger.CHARGE
        )
    ).all()
    return Settlement(
        records=[record[:4] for record in records],
        charges=[-amount for amount in charges],
        shortfalls=[record[4] for record in records],
        statuses=[record[5] for record in records],
    )


@dataclass(frozen=True)
class Audit:
    """What ``flask ledger audit`` reports of some accounts and generations."""

    mismatches: list[str]
    # The ids of the generations it reports as not paid in full.
    shortfalls: set[str]
    # The ids of the generations it reports as charged from a stream's last progress.
    estimated: set[str]


def add_months() -> None:
    """Give the tables partitioned by month (PostgreSQL) the simulated clock's months."""
    retention.add_partitions_ahead()


def audit(account_ids: Iterable[int], generation_ids: Iterable[str]) -> Audit:
    """Run ``flask ledger audit``'s checks; keep what concerns these accounts and generations.

    The audit since the last checkpoint, then ``--full``: the mismatches of both, the
    shortfalls and estimated charges of the full one, which lists every one so far.
    """
    account_ids = list(account_ids)
    generation_subjects = {f"generation {g}": g for g in generation_ids}
    since_checkpoint = audit_ledger(account_ids)
    report = audit_ledger(account_ids, full=True)
    mismatches = since_checkpoint.mismatches + report.mismatches
    return Audit(
        mismatches=[str(m) for m in mismatches if m.account_id in account_ids],
        shortfalls={
            generation_subjects[m.subject]
            for m in report.shortfalls
            if m.subject in generation_subjects
        },
        estimated={
            generation_subjects[m.subject]
            for m in report.estimated
            if m.subject in generation_subjects
        },
    )


def plant_hold_without_balance_condition(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the ledger on purpose: a hold is placed whatever the balance."""
    monkeypatch.setattr(statements, "ACCOUNT_COVERS", true())


def plant_settlement_that_forgets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the lifecycle on purpose: a generation forgets that it was settled."""
    finish = generations.finish_generation

    def finish_and_forget(generation: Generation, **kwargs: Any) -> Decimal:
        charged = finish(generation, **kwargs)
        generation.settled = False
        return charged

    monkeypatch.setattr(generations, "finish_generation", finish_and_forget)


def plant_charge_of_the_whole_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the ledger on purpose: settling charges the worst case, not the usage."""
    settle = ledger.settle_hold

    def settle_the_hold(hold: ledger.HeldCredit, *, cost: Decimal, **kwargs: Any) -> Decimal:
        return settle(hold, cost=hold.amount if cost else cost, **kwargs)

    monkeypatch.setattr(generations, "settle_hold", settle_the_hold)


def plant_charge_capped_at_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the ledger on purpose: usage beyond the hold goes unpaid, whatever the balance."""
    settle = ledger.settle_hold

    def settle_within_the_hold(hold: ledger.HeldCredit, *, cost: Decimal, **kwargs: Any) -> Decimal:
        return settle(hold, cost=min(cost, hold.amount), **kwargs)

    monkeypatch.setattr(generations, "settle_hold", settle_within_the_hold)


def plant_hold_past_the_key_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the ledger on purpose: a key's hold is placed whatever its budget."""
    monkeypatch.setattr(statements, "KEY_WITHIN_LIMIT", true())


def plant_claim_taken_over_after_its_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the claims on purpose: a claim older than the TTL is taken over, charged or not."""

    def abandoned_after_ttl(claim: Any, claim_ttl_seconds: int) -> None:
        if claim.created_at >= idempotency.utcnow() - timedelta(seconds=claim_ttl_seconds):
            raise idempotency.IdempotencyKeyInUse()

    monkeypatch.setattr(idempotency, "_raise_unless_abandoned", abandoned_after_ttl)


def plant_progress_never_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the sweeper on purpose: what a stream delivered is never recorded."""
    monkeypatch.setattr(sweeper, "progress_of", lambda generation: None)


def plant_chains_of_any_account(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the stored responses on purpose: a request continues any account's response."""
    find_chain = response_store.find_chain

    def any_accounts_chain(account_id: int, response_id: str) -> response_store.Chain:
        owner = db.session.get(StoredResponse, response_id)
        return find_chain(account_id if owner is None else owner.account_id, response_id)

    monkeypatch.setattr(response_conversation, "find_chain", any_accounts_chain)
