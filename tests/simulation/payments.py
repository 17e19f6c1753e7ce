"""The simulation's payments: Checkout orders paid by Stripe's events, refunds, and codes.

``PaymentsSimulation`` runs the money path's schedule with payment steps among it. Which
steps are payments, and everything they decide (amounts, which event Stripe delivers
next, whether it delivers it again, how much it refunds), come from a generator of
their own, seeded apart: the steps in between draw from the schedule's generator as a
run without payments would. Stripe is the simulator: it pays an order, then delivers
its events to the gateway's webhook (``POST /billing/stripe/webhook``, signed as Stripe
signs), in any order, some more than once; it refunds part or all of a payment, maybe
after its credit was spent. An operator's redemption code is redeemed by two callers
at once. After every step, beside the money path's invariants: each order is granted
once (and only once paid), refunds never take back more than was paid nor other than
what Stripe refunded, each event id is applied once, each code is redeemed once.
"""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest
import stripe
from flask import Flask
from sqlalchemy import or_, select

from app.credits.models import GRANT, TAKE_BACK, LedgerEntry
from app.extensions import db
from app.money import to_money
from app.payments import events as payment_events
from app.payments.audit import payment_problems
from app.payments.codes import CodeRefused, create_codes, redeem
from app.payments.models import PAID, PaymentOrder
from app.payments.orders import Quote, place_order
from tests.simulation import driver
from tests.simulation.simulator import SimAccount, Simulation

WEBHOOK = "/billing/stripe/webhook"
WEBHOOK_SECRET = "whsec_" + "simulated" * 4
# The share of steps that are payments.
PAYMENT_SHARE = 0.2
# Outcomes of a delivery: applied or recognised as a copy (2xx), or refused for now (409).
APPLIED, DUPLICATE, IGNORED = "applied", "duplicate", "ignored"
REFUSED_FOR_NOW = 409
# What an order or a code did to the ledger: how many grants, their sum, what was taken back.
Sums = tuple[int, Decimal, Decimal]


@dataclass
class SimOrder:
    """An order as Stripe and the simulator know it."""

    id: str
    # Its name in the schedule (its id is new in every run).
    name: str
    account: SimAccount
    amount: Decimal
    total_cents: int
    session: dict[str, Any]
    charge: dict[str, Any] | None = None
    # Whether a paying event of it was applied: it must then be paid, and granted once.
    paid: bool = False
    # The most Stripe had refunded by the refund events applied (cents), as the gateway
    # must have taken back.
    refund_applied: int = 0

    @property
    def refunded(self) -> int:
        """What Stripe refunded of it so far, in cents."""
        return 0 if self.charge is None else self.charge["amount_refunded"]


@dataclass
class SimCode:
    """A code the operator made, and the organisation that redeemed it (once)."""

    id: str
    amount: Decimal
    winners: list[int] = field(default_factory=list)


@dataclass
class Delivery:
    """An event Stripe has still to deliver (again), and the order it concerns."""

    event: dict[str, Any]
    order: SimOrder


class PaymentsSimulation(Simulation):
    """The money path's simulation with payments, refunds and redemption codes among it."""

    def __init__(self, app: Flask, monkeypatch: pytest.MonkeyPatch, **options: Any) -> None:
        super().__init__(app, monkeypatch, **options)
        monkeypatch.setitem(app.config, "STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET)
        self.pay_random = random.Random(f"payments {self.seed}")
        self.orders: list[SimOrder] = []
        self.outbox: list[Delivery] = []
        self.codes: list[SimCode] = []
        # Event ids applied (2xx "applied"): a copy delivered after must be a duplicate.
        self.applied: set[str] = set()
        # Each event's name in the schedule, by its id.
        self.event_names: dict[str, str] = {}
        # The accounts a payment was taken back from: their balance may go below zero.
        self.debtors: set[int] = set()

    # Choosing.

    def choose_action(self) -> Callable[[], str]:
        """A payment step now and then, drawn apart; otherwise the money path's own."""
        if self.pay_random.random() < PAYMENT_SHARE:
            return self.choose_payment()
        return super().choose_action()

    def choose_payment(self) -> Callable[[], str]:
        """Pick the next payment step among those possible now."""
        actions: list[tuple[Callable[[], str], int]] = [(self.buy, 1), (self.offer_code, 1)]
        if self.outbox:
            actions.append((self.deliver, 6))
        if self.refundable():
            actions.append((self.refund, 2))
        choices, weights = zip(*actions, strict=True)
        return self.pay_random.choices(choices, weights)[0]

    # Stripe.

    def buy(self) -> str:
        """A holder buys credits at Checkout and pays; Stripe queues the payment's events.

        A card pays at once (``checkout.session.completed``, paid); a delayed method
        completes unpaid, and its money arrives later (``async_payment_succeeded``).
        """
        account = self.pay_random.choice(self.accounts)
        cents = self.pay_random.randint(1, 8)
        fee_cents = self.pay_random.choice([0, 0, 1])
        amount = Decimal(cents) / 100
        order = place_order(account.id, Quote(amount=amount, fee=Decimal(fee_cents) / 100))
        session = {
            "id": f"cs_test_{order.id}",
            "object": "checkout.session",
            "amount_total": order.total_cents,
            "currency": "usd",
            "client_reference_id": order.id,
            "mode": "payment",
            "payment_status": "paid",
            "status": "complete",
            "payment_intent": "pi_" + secrets.token_hex(12),
        }
        name = f"o{len(self.orders)}"
        sim = SimOrder(order.id, name, account, amount, order.total_cents, session)
        driver.end_reads()
        self.orders.append(sim)
        sim.charge = {
            "id": "ch_" + secrets.token_hex(12),
            "object": "charge",
            "amount": sim.total_cents,
            "amount_refunded": 0,
            "currency": "usd",
            "payment_intent": session["payment_intent"],
            "metadata": {"order_id": order.id},
            "receipt_url": f"https://pay.stripe.test/receipts/{order.id}",
        }
        delayed = self.pay_random.random() < 0.3
        if delayed:
            self.queue(sim, "checkout.session.completed", {**session, "payment_status": "unpaid"})
            self.queue(sim, "checkout.session.async_payment_succeeded", session)
        else:
            self.queue(sim, "checkout.session.completed", session)
        self.queue(sim, "charge.succeeded", sim.charge)
        how = "a delayed method" if delayed else "a card"
        paid = f"${sim.total_cents / 100}"
        return f"a{account.index} pays order {name} of ${amount} ({paid}) by {how}"

    def queue(self, order: SimOrder, event_type: str, obj: dict[str, Any]) -> None:
        """Stripe will deliver an event of ``obj`` as it is now (a copy, maybe twice)."""
        event = {
            "id": "evt_" + secrets.token_hex(12),
            "object": "event",
            "type": event_type,
            "data": {"object": json.loads(json.dumps(obj))},
        }
        self.event_names[event["id"]] = f"e{len(self.event_names)}"
        self.outbox.append(Delivery(event, order))
        if self.pay_random.random() < 0.2:
            self.outbox.append(Delivery(event, order))

    def deliver(self) -> str:
        """Stripe delivers one of its events, whichever; it may deliver it again later."""
        delivery = self.outbox.pop(self.pay_random.randrange(len(self.outbox)))
        event, order = delivery.event, delivery.order
        status, result = self.post(event)
        named = f"{event['type']} {self.event_names[event['id']]} of {order.name}"
        described = f"Stripe delivers {named}: {status}"
        if status == REFUSED_FOR_NOW:
            self.check_refused_for_now(event, order)
            self.outbox.append(delivery)
            return described
        if status != 200:
            self.fail([f"{described}: the webhook answered {status}, expected 2xx"])
        if self.pay_random.random() < 0.15:
            self.outbox.append(delivery)
        self.expect(event, order, result)
        return f"{described} {result}"

    def post(self, event: dict[str, Any]) -> tuple[int, str | None]:
        """POST the event to the webhook, signed; return the status and the result it tells."""
        payload = json.dumps(event)
        header = stripe.WebhookSignature.generate_signature_header(payload, WEBHOOK_SECRET)
        answer = self.app.test_client().post(
            WEBHOOK,
            data=payload,
            headers={"Stripe-Signature": header, "Content-Type": "application/json"},
        )
        body = answer.get_json(silent=True) or {}
        return answer.status_code, body.get("result")

    def check_refused_for_now(self, event: dict[str, Any], order: SimOrder) -> None:
        """Only a refund whose payment is not applied yet may be refused, to come again."""
        if event["type"] != "charge.refunded" or order.paid:
            self.fail([f"{event['type']} {event['id']} of {order.name} was refused"])

    def expect(self, event: dict[str, Any], order: SimOrder, result: str | None) -> None:
        """An event applies once: a copy after is a duplicate; what it applied is noted."""
        first = event["id"] not in self.applied
        if result == APPLIED and not first:
            self.fail([f"{event['id']} ({event['type']}) was applied again"])
        if result == DUPLICATE and first:
            self.fail([f"{event['id']} ({event['type']}) was a duplicate of nothing applied"])
        if result != APPLIED:
            return
        self.applied.add(event["id"])
        obj = event["data"]["object"]
        if event["type"] == "checkout.session.async_payment_succeeded" or (
            event["type"] == "checkout.session.completed" and obj["payment_status"] == "paid"
        ):
            order.paid = True
        if event["type"] == "charge.refunded":
            order.refund_applied = max(order.refund_applied, obj["amount_refunded"])
            self.debtors.add(order.account.id)

    def refundable(self) -> list[SimOrder]:
        """The orders Stripe took money for and has not refunded whole."""
        return [o for o in self.orders if o.charge is not None and o.refunded < o.total_cents]

    def refund(self) -> str:
        """Stripe refunds part or the rest of a payment; its charge.refunded is queued."""
        refundable = self.refundable()
        states = driver.account_states([account.id for account in self.accounts])
        driver.end_reads()
        # Often one refunded in part already (its refunds' events then race each other),
        # or one whose credit was spent (its account goes into debt).
        begun = [order for order in refundable if order.refunded]
        spent = [o for o in refundable if o.paid and states[o.account.id].balance < o.amount]
        roll = self.pay_random.random()
        if begun and roll < 0.4:
            refundable = begun
        elif spent and roll < 0.8:
            refundable = spent
        order = self.pay_random.choice(refundable)
        balance = states[order.account.id].balance
        left = order.total_cents - order.refunded
        cents = left if self.pay_random.random() < 0.3 else self.pay_random.randint(1, left)
        order.charge["amount_refunded"] += cents
        order.charge["refunded"] = order.refunded == order.total_cents
        self.queue(order, "charge.refunded", order.charge)
        spent = f"a{order.account.index} has ${balance}"
        return f"Stripe refunds {cents} cents of {order.name} ({order.refunded} in all; {spent})"

    # Codes.

    def offer_code(self) -> str:
        """The operator makes a code; the organisation redeems it twice at once: once wins.

        Twice by the same organisation (two of its members, say): which of the two wins
        is the database's to decide, and the books must not depend on it, or a seed
        would not replay its schedule.
        """
        amount = Decimal(self.pay_random.randint(1, 200)) / 10_000
        (code,) = create_codes(amount)
        sim = SimCode(code.split("_")[1], amount)
        self.codes.append(sim)
        account = self.pay_random.choice(self.accounts)
        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = list(pool.map(lambda _: self.redeem_apart(account.id, code), range(2)))
        sim.winners = [account.id] * outcomes.count(True)
        if len(sim.winners) != 1:
            self.fail([f"code {sim.id} redeemed {len(sim.winners)} times by 2 redemptions at once"])
        name = f"c{len(self.codes) - 1}"
        return f"a{account.index} redeems code {name} of ${amount} twice at once: once granted"

    def redeem_apart(self, account_id: int, code: str) -> bool:
        """Redeem as a request of its own would, in a thread; return whether it was granted."""
        with self.app.app_context():
            try:
                redeem(account_id, code)
            except CodeRefused:
                return False
            finally:
                db.session.remove()
        return True

    # Invariants.

    def check_refusal(
        self, request: Any, outcome: Any, expected: int | None, forecast: Any
    ) -> None:
        """An account in debt is refused as such, and only while its balance is below zero."""
        if not isinstance(outcome, driver.Shortage) or outcome.limit != driver.DEBT:
            super().check_refusal(request, outcome, expected, forecast)
            return
        balance = driver.account_states([request.account.id])[request.account.id].balance
        driver.end_reads()
        if expected is not None or balance >= 0 or request.account.id not in self.debtors:
            self.fail([f"{request.name} refused as in debt with a balance of ${balance}"])

    def balance_problems(self, states: dict[int, driver.AccountState]) -> Iterator[str]:
        """The money path's, but what was taken back may leave less than nothing available."""
        below = {f"a{a.index}: available" for a in self.accounts if a.id in self.debtors}
        for problem in super().balance_problems(states):
            if not any(problem.startswith(name) for name in below):
                yield problem

    def check_invariants(self, *, audit: bool) -> None:
        """The money path's invariants, then the payments' and the codes'."""
        super().check_invariants(audit=audit)
        problems = []
        if self.orders or self.codes:
            entries = ledger_sums([account.id for account in self.accounts])
            problems += [*self.order_problems(entries), *self.code_problems(entries)]
        driver.end_reads()
        if problems:
            self.fail(problems)

    def audit_problems(self, account_ids: list[int]) -> list[str]:
        """The audit's, and its payments' part: each paid order has its grant, and back."""
        return super().audit_problems(account_ids) + payment_problems(account_ids)

    def order_problems(self, entries: dict[str, Sums]) -> Iterator[str]:
        """Each order granted once when paid, never before; taken back as Stripe refunded."""
        if not self.orders:
            return
        stored = {
            order.id: order
            for order in db.session.scalars(
                select(PaymentOrder).where(PaymentOrder.id.in_([o.id for o in self.orders]))
            )
        }
        for order in self.orders:
            row, named = stored[order.id], f"order {order.name} ({order.id})"
            grants, granted, taken = entries.get(f"order:{order.id}", (0, Decimal(0), Decimal(0)))
            if (row.status == PAID) != order.paid:
                yield f"{named} is {row.status}, its paying event applied: {order.paid}"
            if grants != order.paid or granted != (order.amount if order.paid else 0):
                yield f"{named} was granted {grants} times, ${granted} in all"
            owed = to_money(order.amount * order.refund_applied / order.total_cents)
            if -taken != owed or row.refunded_cents > order.total_cents:
                yield (
                    f"{named} of ${order.amount}: ${-taken} taken back, "
                    f"${owed} refunded ({order.refund_applied} of {order.total_cents} cents)"
                )

    def code_problems(self, entries: dict[str, Sums]) -> Iterator[str]:
        """Each code granted once, to the caller who won it."""
        for code in self.codes:
            grants, granted, _ = entries.get(f"code:{code.id}", (0, Decimal(0), Decimal(0)))
            if grants != 1 or granted != code.amount:
                yield f"code {code.id} of ${code.amount} granted {grants} times, ${granted} in all"

    # The end.

    def drain(self) -> None:
        """Stripe delivers what it has left (a refund after its payment), then the requests end."""
        while self.outbox:
            self.step += 1
            self.perform(self.deliver)
        super().drain()


def ledger_sums(account_ids: list[int]) -> dict[str, Sums]:
    """What each order and code (``order:<id>``, ``code:<id>``) granted and took back.

    For each: how many grants, their sum, and the sum of the take-backs under keys it
    begins (a refund's is ``order:<id>:refunded:<cents>``).
    """
    entries = db.session.execute(
        select(LedgerEntry.idempotency_key, LedgerEntry.kind, LedgerEntry.amount).where(
            LedgerEntry.account_id.in_(account_ids),
            or_(
                LedgerEntry.idempotency_key.startswith("order:"),
                LedgerEntry.idempotency_key.startswith("code:"),
            ),
        )
    )
    found: dict[str, Sums] = {}
    for key, kind, amount in entries:
        source = ":".join(key.split(":")[:2])
        grants, granted, taken = found.get(source, (0, Decimal(0), Decimal(0)))
        if kind == GRANT:
            grants, granted = grants + 1, granted + amount
        elif kind == TAKE_BACK:
            taken += amount
        found[source] = (grants, granted, taken)
    return found


def plant_event_ids_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the webhook on purpose: an event's id is never recorded, each copy applies."""
    monkeypatch.setattr(payment_events, "_record", lambda connection, event_id, kind: True)


def plant_refund_of_all_refunded_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break refunds on purpose: each takes back all Stripe refunded so far, not what it adds."""
    original = payment_events._charge_refunded

    def refund_all_again(connection: Any, charge: dict[str, Any]) -> str | None:
        order = payment_events._paid_order_of(connection, charge)
        if order is not None:
            connection.execute(
                payment_events.orders.update()
                .where(payment_events.orders.c.id == order.id)
                .values(taken_back=0)
            )
        return original(connection, charge)

    monkeypatch.setitem(payment_events.HANDLERS, "charge.refunded", refund_all_again)
