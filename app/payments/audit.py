"""The payments' part of the audit: every paid order has its grant, every grant its paid order."""

from __future__ import annotations

from sqlalchemy import select

from app.credits.models import GRANT, LedgerEntry
from app.extensions import db
from app.payments.models import PAID, PaymentOrder

# A payment's grant is keyed ``order:<order id>`` (app.payments.events).
ORDER_KEY = "order:"


def payment_problems(account_ids: list[int] | None = None) -> list[str]:
    """Return one line per paid order without its grant, and per order grant without its order."""
    orders = select(PaymentOrder.account_id, PaymentOrder.id).where(PaymentOrder.status == PAID)
    grants = select(LedgerEntry.account_id, LedgerEntry.idempotency_key).where(
        LedgerEntry.kind == GRANT, LedgerEntry.idempotency_key.startswith(ORDER_KEY)
    )
    if account_ids:
        orders = orders.where(PaymentOrder.account_id.in_(account_ids))
        grants = grants.where(LedgerEntry.account_id.in_(account_ids))
    paid = {(account_id, order_id) for account_id, order_id in db.session.execute(orders)}
    granted = {
        (account_id, key.removeprefix(ORDER_KEY)) for account_id, key in db.session.execute(grants)
    }
    db.session.commit()
    problems = [
        f"account {account_id}: order {order_id} is paid but has no grant"
        for account_id, order_id in sorted(paid - granted)
    ]
    problems += [
        f"account {account_id}: a grant names order {order_id}, which is not paid"
        for account_id, order_id in sorted(granted - paid)
    ]
    return problems
