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
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import bindparam, func, select, true, type_coerce, update

from app import budgets, sweeper
from app.accounts import budgets as budget_admin
from app.accounts import keys as key_admin
from app.accounts import members
from app.accounts.invites import accept_invite
from app.accounts.models import MEMBER, Membership
from app.accounts.organisations import create_account, owner_membership
from app.auth import keys
from app.auth.models import ACTIVE, ApiKey
from app.catalog.pricing import (
    NO_SURCHARGES,
    PER_MILLION,
    Pricing,
    Surcharges,
    worst_case_cost,
)
from app.catalog.registry import Model
from app.completions.bodies import chunk_bodies, completion_body
from app.credits import balances, entries, expiry, grants, holds
from app.credits import settlement as settling
from app.credits.chain import GENESIS
from app.credits.chain_audit import verify_chains
from app.credits.errors import InsufficientCredits
from app.credits.models import CHARGE, OPEN, Account, Hold, LedgerEntry
from app.credits.sql import guards
from app.credits.sql import settlement as settlement_sql
from app.database import Money
from app.encoding import dumps
from app.extensions import db
from app.generations import audit as audit_module
from app.generations import idempotency, prompts, retention
from app.generations import lifecycle as generations
from app.generations.audit import audit_ledger
from app.generations.lifecycle import Generation, relay_generation, relay_stream
from app.generations.models import CHAT, MESSAGES, RESPONSES
from app.generations.models import Generation as GenerationRecord
from app.messages import native
from app.messages.schemas import parse_messages_request
from app.messages.translation import StreamTranslation as MessagesStream
from app.messages.translation import chat_request as translated_request
from app.messages.translation import message_of
from app.money import to_money
from app.providers import cooldown
from app.providers.base import ChatRequest, Route, RouteTarget, Usage
from app.providers.cooldown import LocalCooldowns, cooldown_policy, upstream_cooldowns
from app.responses import conversation as response_conversation
from app.responses import native as responses_native
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
from tests.simulation.upstream import SCRIPT_FIELD, SimulatedAdapter, SimulatedNativeAdapter, words

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
    """Make the money path, keys, claims, stored responses, audit and pruning read ``clock``.

    The upstream's cooldowns too, on a board of the run's own: a cooldown begun by three
    failures in a row ends after its seconds of the simulated clock, and what a run
    before left on the process's board does not carry over.
    """
    for module in (
        balances,
        entries,
        expiry,
        holds,
        settling,
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
    monkeypatch.setattr(cooldown, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(upstream_cooldowns, "store", LocalCooldowns())


def disturb_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leave the process as a run before it and a machine of another speed may leave it.

    The process's board of upstream cooldowns has the simulated upstream cooling down,
    as a run's failures leave it, and the process's own clocks (``time.monotonic``,
    ``time.time``) stand still, so that no cooldown begun by them ever ends. A simulated
    world that read either would take another course than it did.
    """
    monotonic, wall = time.monotonic(), time.time()
    monkeypatch.setattr(time, "monotonic", lambda: monotonic)
    monkeypatch.setattr(time, "time", lambda: wall)
    upstream = SimulatedAdapter().upstream
    monkeypatch.setattr(upstream_cooldowns, "store", LocalCooldowns())
    for _ in range(cooldown_policy(upstream).failures):
        upstream_cooldowns.note_failure(upstream)


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
    ) -> Generation | Shortage | int:
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
    ) -> tuple[Generation, Turn] | Shortage | int:
        """``start_response`` in ``worker``, which renews its hold from then on."""
        self.serving = worker
        try:
            return start_response(key_value, model, body, clock, ttl)
        finally:
            self.serving = None

    def start_native(
        self,
        worker: int,
        key_value: str,
        model: Model,
        body: dict[str, Any],
        clock: SimulatedClock,
        ttl: int,
    ) -> Generation | Shortage | int:
        """``start_native`` in ``worker``, which renews its hold from then on."""
        self.serving = worker
        try:
            return start_native(key_value, model, body, clock, ttl)
        finally:
            self.serving = None

    def start_native_response(
        self,
        worker: int,
        key_value: str,
        model: Model,
        body: dict[str, Any],
        clock: SimulatedClock,
        ttl: int,
    ) -> tuple[Generation, Turn, dict[str, Any]] | Shortage | int:
        """``start_native_response`` in ``worker``, which renews its hold from then on."""
        self.serving = worker
        try:
            return start_native_response(key_value, model, body, clock, ttl)
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


# The passed-through model: cache writes of each TTL and web searches priced apart.
NATIVE_MODEL = "sim-native"
NATIVE_PRICES = {
    "prompt": "0.50",
    "completion": "1.50",
    "cached_read": "0.05",
    "cache_write": "0.625",
    "cache_write_1h": "1.00",
}
WEB_SEARCH_PRICE = Decimal("0.0002")
# The service tiers it prices, by what every price is multiplied by; the others cost 1.
NATIVE_TIERS = {"priority": Decimal(2)}


def native_model(adapter: SimulatedNativeAdapter) -> Model:
    """The model whose Messages requests pass through to ``adapter`` untranslated."""
    prices = {name: Decimal(amount) for name, amount in NATIVE_PRICES.items()}
    target = RouteTarget(upstream_model=NATIVE_MODEL, max_output_tokens=1024)
    return Model(
        id=NATIVE_MODEL,
        owned_by="simulation",
        context_length=8192,
        max_output_tokens=1024,
        capabilities=frozenset(),
        pricing=Pricing(
            image=Decimal(0),
            tool_calls={"web_search": WEB_SEARCH_PRICE},
            tiers=NATIVE_TIERS,
            **prices,
        ),
        routes=(Route(adapter=adapter, target=target),),
    )


def price(usage: Usage, model: Model) -> Decimal:
    """What ``usage`` costs at the catalog's prices, each kind of token at its own rate.

    Stated here apart from the gateway's pricing, so that a charge is checked against
    the catalog, not against the code that made it.
    """
    rates = model.pricing
    write_5m = usage.cache_write_tokens - usage.cache_write_1h_tokens
    plain = usage.prompt_tokens - usage.cached_tokens - usage.cache_write_tokens
    micro_usd = (
        plain * rates.prompt
        + usage.cached_tokens * rates.cached_read
        + write_5m * rates.cache_write
        + usage.cache_write_1h_tokens * rates.cache_write_1h
        + usage.completion_tokens * rates.completion
    )
    calls = sum(
        (count * rates.tool_calls[tool] for tool, count in (usage.tool_calls or {}).items()),
        Decimal(0),
    )
    # The tier the upstream says it served in multiplies all of it.
    multiplier = NATIVE_TIERS.get(usage.service_tier, Decimal(1))
    return to_money((micro_usd / PER_MILLION + calls) * multiplier)


def worst_case(
    model: Model,
    *,
    prompt_tokens: int,
    max_tokens: int,
    surcharges: Surcharges = NO_SURCHARGES,
) -> Decimal:
    """The most a request can cost: what its hold must cover."""
    return worst_case_cost(
        prompt_tokens=prompt_tokens,
        completion_tokens=max_tokens,
        pricing=model.pricing,
        surcharges=surcharges,
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
    _, applied = grants.grant_credits(
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


def set_member_budget(member_id: int, amount: Decimal | None, window: str) -> None:
    """Set (or with None, lift) the member's budget of ``amount`` a ``window``."""
    budget_admin.set_member_budget(member_id, amount=amount, window=window)


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


def native_body(
    number: int,
    model: Model,
    *,
    max_tokens: int,
    found: int,
    searches: int,
    tier: str | None = None,
    stream: bool = False,
) -> dict[str, Any]:
    """The Messages body of passed-through request ``number``.

    Most of its prompt sits in a ``search_result`` block, which the translation does not
    read (``found`` words of it); it offers web search, ``searches`` calls at most; it
    asks for the service ``tier``, if one, and for a stream if ``stream``.
    """
    result = {
        "type": "search_result",
        "source": f"https://example.com/{number}",
        "title": f"result {number}",
        "content": [{"type": "text", "text": words(found)}],
    }
    question = {"type": "text", "text": f"simulated request {number}"}
    body = {
        "model": model.id,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": [result, question]}],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": searches}],
        SCRIPT_FIELD: number,
    }
    if tier is not None:
        body["service_tier"] = tier
    if stream:
        body["stream"] = True
    return body


def native_terms(body: dict[str, Any], model: Model) -> tuple[int, Surcharges]:
    """The prompt tokens the gateway counts in ``body``, and the surcharges it holds for."""
    prompt = prompts.sent_prompt(body, native.SENT_BODY, model)
    return prompt.count(), native.surcharges_of(body)


def start_native(
    key_value: str, model: Model, body: dict[str, Any], clock: SimulatedClock, ttl: int
) -> Generation | Shortage | int:
    """Start a Messages request passed through, as its door does; or return why not."""
    caller = keys.find_caller(key_value)
    if caller is None or caller.state != ACTIVE:
        db.session.rollback()
        return UNAUTHORIZED if caller is None else REVOKED
    try:
        generation = generations.start_generation(
            caller=caller,
            model=model,
            request=native.passed_request(parse_messages_request(body), model),
            hold_ttl_seconds=ttl,
            api=MESSAGES,
            surcharges=native.surcharges_of(body),
            prompt=prompts.sent_prompt(body, native.SENT_BODY, model),
        )
    except InsufficientCredits as refusal:
        db.session.rollback()
        return shortage(refusal)
    generation.started = clock.monotonic()
    return generation


def relay_whole(generation: Generation, body: dict[str, Any]) -> dict[str, Any]:
    """Pass a whole request through; return the Message its caller is answered."""
    call = native.native_call(body, generation, {}, stream=False)
    answer, usage, cost = relay_generation(generation, call, native.whole_outcome(generation))
    return native.answered(answer.decoded, generation, cost, usage)


def open_native_stream(
    generation: Generation, body: dict[str, Any]
) -> Iterator[list[dict[str, Any]]]:
    """What the caller of a streamed Messages request passed through receives, send by send.

    The door's writer sends each upstream read's completed events as they came (up to
    the next flush point), and the kept-back end with its cost; each send is read back
    into its events' bodies.
    """
    relayed = native.RelayedStream(generation)
    call = native.native_call(body, generation, {}, stream=True)
    return _sends(relayed.events(relay_stream(generation, call, relayed)))


def _sends(framed: Iterator[bytes | None]) -> Iterator[list[dict[str, Any]]]:
    """The bodies of a relayed stream's sends: its frames up to each flush point."""
    send: list[dict[str, Any]] = []
    try:
        for item in framed:
            if item:
                send += events_of(item)
            elif item is None and send:
                yield send
                send = []
        if send:
            yield send
    finally:
        framed.close()


def native_response_body(number: int, model: Model, *, max_tokens: int) -> dict[str, Any]:
    """The Responses body of passed-through request ``number``: streamed, not stored."""
    return {
        "model": model.id,
        "input": [{"role": "user", "content": f"simulated request {number}"}],
        "max_output_tokens": max_tokens,
        "stream": True,
        "store": False,
        SCRIPT_FIELD: number,
    }


def native_response_terms(
    body: dict[str, Any], model: Model, account_id: int
) -> tuple[int, Surcharges]:
    """The prompt tokens and surcharges of a Responses body the gateway passes through.

    Those of the body it forwards, as its door counts them.
    """
    request = parse_response_request(body)
    sent = responses_native.sent_items(body, request)
    turn = Turn(
        request, account_id=account_id, response_id=new_response_id(), ttl_days=1, sent=sent
    )
    forwarded = responses_native.forwarded_body(turn, body)
    prompt = prompts.sent_prompt(forwarded, responses_native.SENT_BODY, model)
    db.session.rollback()
    return prompt.count(), responses_native.surcharges_of(body, passed_through=True)


def start_native_response(
    key_value: str, model: Model, body: dict[str, Any], clock: SimulatedClock, ttl: int
) -> tuple[Generation, Turn, dict[str, Any]] | Shortage | int:
    """Start a Responses request passed through, as its door does; or return why not.

    Returns its generation, its turn and the body forwarded to the upstream.
    """
    caller = keys.find_caller(key_value)
    if caller is None or caller.state != ACTIVE:
        db.session.rollback()
        return UNAUTHORIZED if caller is None else REVOKED
    request = parse_response_request(body)
    sent = responses_native.sent_items(body, request)
    turn = Turn(
        request,
        account_id=caller.account_id,
        response_id=new_response_id(),
        ttl_days=RESPONSES_TTL_DAYS,
        sent=sent,
    )
    forwarded = responses_native.forwarded_body(turn, body)
    try:
        generation = generations.start_generation(
            caller=caller,
            model=model,
            request=responses_native.passed_request(request),
            hold_ttl_seconds=ttl,
            generation_id=turn.draft.id,
            api=RESPONSES,
            surcharges=responses_native.surcharges_of(body, passed_through=True),
            prompt=prompts.sent_prompt(forwarded, responses_native.SENT_BODY, model),
        )
    except InsufficientCredits as refusal:
        db.session.rollback()
        return shortage(refusal)
    generation.started = clock.monotonic()
    return generation, turn, forwarded


def open_native_response_stream(
    generation: Generation, turn: Turn, forwarded: dict[str, Any]
) -> Iterator[list[dict[str, Any]]]:
    """What the caller of a streamed Responses request passed through receives, send by send."""
    relayed = responses_native.RelayedStream(turn, generation)
    call = responses_native.native_call(turn, forwarded, generation)
    return _sends(relayed.events(relay_stream(generation, call, relayed)))


def events_of(framed: bytes) -> list[dict[str, Any]]:
    """The bodies of the server-sent events in ``framed``."""
    return [
        json.loads(line[len(b"data: ") :], parse_float=Decimal)
        for line in framed.splitlines()
        if line.startswith(b"data: ")
    ]


def start(
    key_value: str,
    model: Model,
    request: ChatRequest,
    clock: SimulatedClock,
    ttl: int,
    generation_id: str | None = None,
) -> Generation | Shortage | int:
    """Authenticate as the view does and hold the worst case; or return why not (a 402's reason)."""
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
    except InsufficientCredits as refusal:
        db.session.rollback()
        return shortage(refusal)
    # The lifecycle's own timestamps must come from the simulated clock too.
    generation.started = clock.monotonic()
    return generation


@dataclass(frozen=True)
class Shortage:
    """A 402, as its message tells it: the limit it names, what was asked, what is left.

    A budget's refusal also names the budget's amount and window.
    """

    limit: str
    requested: Decimal
    left: Decimal
    budget: Decimal | None = None
    window: str | None = None

    # Not a field: every shortage is a 402.
    status = INSUFFICIENT


# How a 402's message names the limit that refused the hold (app.generations.refusals).
BALANCE, KEY_BUDGET, MEMBER_BUDGET = "balance", "key", "member"
# An account in debt is refused as such, whatever the request (a payment taken back).
DEBT = "debt"
_HOLDERS = {"this API key's": KEY_BUDGET, "the member's": MEMBER_BUDGET}
_WINDOWS = {
    "daily": budgets.DAY,
    "weekly": budgets.WEEK,
    "monthly": budgets.MONTH,
    "5-hour": budgets.FIVE_HOURS,
}
# An amount in USD as a message shows it (its digits, without the sentence's full stop).
_USD = r"\$(\d+(?:\.\d+)?)"
_BUDGET_REFUSAL = re.compile(
    rf"under (this API key's|the member's) (\S+) (?:limit|budget) of {_USD}: this request"
    rf" may cost up to {_USD} but (?:the key|the member) has {_USD} left"
)
_DEBT_REFUSAL = re.compile(r"in debt \(balance \$(-\d+(?:\.\d+)?)\)")
_BALANCE_REFUSAL = re.compile(rf"may cost up to {_USD} but the available balance is {_USD}")


def shortage(refusal: InsufficientCredits) -> Shortage:
    """Read the limit a 402 names, and its figures, from its message.

    An account in debt names none: its shortage is the debt, with the balance left.
    """
    if debt := _DEBT_REFUSAL.search(refusal.message):
        return Shortage(DEBT, Decimal(0), Decimal(debt[1]))
    if named := _BUDGET_REFUSAL.search(refusal.message):
        holder, window, budget, requested, left = named.groups()
        return Shortage(
            _HOLDERS[holder], Decimal(requested), Decimal(left), Decimal(budget), _WINDOWS[window]
        )
    named = _BALANCE_REFUSAL.search(refusal.message)
    if named is None:
        raise AssertionError(f"a 402 names no limit: {refusal.message}")
    return Shortage(BALANCE, Decimal(named[1]), Decimal(named[2]))


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
) -> tuple[Generation, Turn] | Shortage | int:
    """Start a Responses API request as its door does; or return why not (a 402's reason).

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
    except InsufficientCredits as refusal:
        db.session.rollback()
        return shortage(refusal)
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


def ends_generation(send: list[dict[str, Any]]) -> bool:
    """Whether a relayed stream's send is the one its upstream ended the generation in.

    The simulated upstream sends the end of the text in the read that brings the event
    the door keeps back for the end, with its cost: Messages' text block's stop with
    ``message_delta``, Responses' ``response.output_text.done`` with its last event.
    """
    return any(body.get("type") in TEXT_ENDS for body in send)


TEXT_ENDS = ("content_block_stop", "response.output_text.done")


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
    type_coerce(_sum_of(Hold, Hold.status == OPEN), Money()),
).where(Account.id.in_(_ACCOUNT_IDS))
_OPEN_HOLDS = (
    select(Hold.id, Hold.account_id, Hold.amount, Hold.expires_at)
    .where(Hold.account_id.in_(_ACCOUNT_IDS), Hold.status == OPEN)
    .order_by(Hold.expires_at)
)


def account_states(account_ids: list[int]) -> dict[int, AccountState]:
    """Each account's balance and reserved, and the sums of its ledger and open holds."""
    rows = db.session.execute(_ACCOUNT_STATES, {"account_ids": account_ids}).all()
    return {account_id: AccountState(*sums) for account_id, *sums in rows}


_KEY_IDS = bindparam("key_ids", expanding=True)


@dataclass(frozen=True)
class BudgetRow:
    """A key's or a member's budget and counters, as its row holds them."""

    budget: Decimal | None
    window: str
    start: int | None
    spent: Decimal
    reserved: Decimal


def _budget_columns(row: Any) -> tuple[Any, ...]:
    return (
        row.id,
        row.budget,
        row.budget_window,
        row.window_start,
        row.window_spent,
        row.window_reserved,
    )


_MEMBER_IDS = bindparam("member_ids", expanding=True)
_KEY_BUDGETS = select(*_budget_columns(ApiKey)).where(ApiKey.id.in_(_KEY_IDS))
_MEMBER_BUDGETS = select(*_budget_columns(Membership)).where(Membership.id.in_(_MEMBER_IDS))


def budget_rows(
    key_ids: list[int], member_ids: list[int]
) -> tuple[dict[int, BudgetRow], dict[int, BudgetRow]]:
    """The budget columns of the keys' rows, and of the members' (removed ones too)."""
    keys = db.session.execute(_KEY_BUDGETS, {"key_ids": key_ids})
    members = db.session.execute(_MEMBER_BUDGETS, {"member_ids": member_ids})
    return (
        {row_id: BudgetRow(*columns) for row_id, *columns in keys},
        {row_id: BudgetRow(*columns) for row_id, *columns in members},
    )


def spent_in_window(row: BudgetRow, now: datetime) -> Decimal:
    """What the row spent in the window ``now`` falls in, by the ledger's window rules."""
    start = budgets.current_window_start(row.window, row.start, now)
    return row.spent if row.start == start else Decimal(0)


def open_holds(account_ids: list[int]) -> list[OpenHold]:
    """The open holds of the accounts."""
    rows = db.session.execute(_OPEN_HOLDS, {"account_ids": account_ids}).all()
    return [OpenHold(*row) for row in rows]


def hold_is_open(hold_id: str) -> bool:
    """Whether the hold is still open."""
    status = db.session.scalar(select(Hold.status).where(Hold.id == hold_id))
    return status == OPEN


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
            LedgerEntry.generation_id == generation_id, LedgerEntry.kind == CHARGE
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
    The audit verifies the accounts' hash chains too.
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


def chain_problems(account_ids: list[int], checked: dict[int, tuple[Any, ...]]) -> list[str]:
    """Verify the accounts' hash chains as ``flask ledger verify`` does; say where each breaks.

    ``checked`` keeps, of each account the last check found sound, its row's head and
    balance and its last entry. An account found as it was left is not read again: its
    entries cannot change (the database refuses it). Any other is verified, taken up
    after its last entry found sound, so that a step costs the entries it wrote; while
    every chain holds, ``checked`` is moved on.
    """
    last_entry = (
        select(func.max(LedgerEntry.id))
        .where(LedgerEntry.account_id == Account.id)
        .scalar_subquery()
    )
    rows = db.session.execute(
        select(Account.id, Account.ledger_head, Account.balance, last_entry).where(
            Account.id.in_(account_ids)
        )
    ).all()
    db.session.commit()
    seen = {row[0]: tuple(row[1:]) for row in rows}
    changed = [account for account in account_ids if checked.get(account) != seen.get(account)]
    if not changed:
        return []
    after = {account: checked[account][-1] for account in changed if account in checked}
    report = verify_chains(changed, after=after)
    if not report.problems:
        checked.update({account: seen[account] for account in changed})
    return [f"chain of {problem}" for problem in report.problems]


def plant_hold_without_balance_condition(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the ledger on purpose: a hold is placed whatever the balance."""
    monkeypatch.setattr(guards, "ACCOUNT_COVERS", true())


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
    settle = settling.settle_hold

    def settle_the_hold(hold: balances.HeldCredit, *, cost: Decimal, **kwargs: Any) -> Decimal:
        return settle(hold, cost=hold.amount if cost else cost, **kwargs)

    monkeypatch.setattr(generations, "settle_hold", settle_the_hold)


def plant_charge_capped_at_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the ledger on purpose: usage beyond the hold goes unpaid, whatever the balance."""
    settle = settling.settle_hold

    def settle_within_the_hold(
        hold: balances.HeldCredit, *, cost: Decimal, **kwargs: Any
    ) -> Decimal:
        return settle(hold, cost=min(cost, hold.amount), **kwargs)

    monkeypatch.setattr(generations, "settle_hold", settle_within_the_hold)


def plant_hold_past_the_key_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the ledger on purpose: a key's hold is placed whatever its budget."""
    monkeypatch.setattr(guards, "KEY_WITHIN_LIMIT", true())


def plant_hold_past_the_member_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the ledger on purpose: a hold is placed whatever the budget of the key's member."""
    monkeypatch.setattr(guards, "MEMBER_WITHIN_BUDGET", true())


def plant_rollups_that_miss_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the ledger on purpose: a charge is totalled in its hour without its request."""
    totals = settling._rollup_parameters

    def without_the_request(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**totals(*args, **kwargs), settlement_sql.ROLLUP_PREFIX + "requests": 0}

    monkeypatch.setattr(settling, "_rollup_parameters", without_the_request)


def plant_claim_taken_over_after_its_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the claims on purpose: a claim older than the TTL is taken over, charged or not."""

    def abandoned_after_ttl(claim: Any, claim_ttl_seconds: int) -> None:
        if claim.created_at >= idempotency.utcnow() - timedelta(seconds=claim_ttl_seconds):
            raise idempotency.IdempotencyKeyInUse()

    monkeypatch.setattr(idempotency, "_raise_unless_abandoned", abandoned_after_ttl)
    # Nor is the taken-over generation's hold voided: it runs on, and charges.
    monkeypatch.setattr(idempotency, "void_hold", lambda connection, **hold: True)


def plant_progress_never_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the sweeper on purpose: what a stream delivered is never recorded."""
    monkeypatch.setattr(sweeper, "progress_of", lambda generation: None)


def plant_grants_that_leave_the_head_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the ledger on purpose: a grant chains its entry, but the head stays where it was.

    Only on an account with entries already: its first, opened with the account, is
    chained as it should be.
    """
    append = grants.append_entry

    def append_leaving_the_head(connection: Any, **kwargs: Any) -> bool:
        account = Account.__table__.c
        row = account.id == kwargs["account_id"]
        head = connection.execute(select(account.ledger_head).where(row)).scalar_one()
        chained = append(connection, **kwargs)
        if head != GENESIS:
            connection.execute(update(Account.__table__).where(row).values(ledger_head=head))
        return chained

    monkeypatch.setattr(grants, "append_entry", append_leaving_the_head)


def plant_uncounted_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the prompt counter on purpose: a body's ``search_result`` blocks are skipped."""
    counted_as_media = prompts.counted_as_media

    def skipping_search_results(block: dict[str, Any], *args: Any) -> bool:
        return block.get("type") == "search_result" or counted_as_media(block, *args)

    monkeypatch.setattr(prompts, "counted_as_media", skipping_search_results)


def plant_tier_priced_at_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the tiers on purpose: a generation is recorded in its tier, priced as standard."""
    priced_tier = generations.priced_tier

    def at_one(*args: Any) -> tuple[str | None, Decimal]:
        return priced_tier(*args)[0], Decimal(1)

    monkeypatch.setattr(generations, "priced_tier", at_one)


def plant_relayed_usage_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the relayed Messages stream on purpose: only message_start's usage is kept.

    Its ``message_delta``, whose usage holds the whole output and the web searches, is
    read for its stop reason alone: a stream that ran to its end is billed for one
    output token.
    """
    take_usage = native.RelayedStream.take_usage

    def first_usage_only(stream: native.RelayedStream, usage: Any) -> None:
        if not stream.counts:
            take_usage(stream, usage)

    monkeypatch.setattr(native.RelayedStream, "take_usage", first_usage_only)


def plant_chains_of_any_account(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the stored responses on purpose: a request continues any account's response."""
    find_chain = response_store.find_chain

    def any_accounts_chain(account_id: int, response_id: str) -> response_store.Chain:
        owner = db.session.get(StoredResponse, response_id)
        return find_chain(account_id if owner is None else owner.account_id, response_id)

    monkeypatch.setattr(response_conversation, "find_chain", any_accounts_chain)
