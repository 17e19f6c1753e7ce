"""flask ledger audit holds payments to the ledger: a paid order has its grant, and back."""

from __future__ import annotations

from decimal import Decimal

from app.credits.grants import grant_credits
from app.extensions import db
from app.payments.events import apply_event
from app.payments.models import PAID
from app.payments.orders import Quote, place_order
from tests.factories import AccountFactory


def completed(order) -> dict:
    session = {
        "id": f"cs_{order.id}",
        "object": "checkout.session",
        "amount_total": order.total_cents,
        "currency": "usd",
        "client_reference_id": order.id,
        "payment_status": "paid",
    }
    return {
        "id": f"evt_{order.id}",
        "type": "checkout.session.completed",
        "data": {"object": session},
    }


def test_the_audit_finds_a_paid_order_without_grant_and_a_grant_without_order(disposable_app):
    runner = disposable_app.test_cli_runner()
    with disposable_app.app_context():
        account = AccountFactory.create()
        paid = place_order(account.id, Quote(amount=Decimal(10), fee=Decimal(0)))
        apply_event(completed(paid))
        account_id, paid_id = account.id, paid.id
        assert runner.invoke(args=["ledger", "audit", "--full"]).exit_code == 0
        # Broken on purpose: an order marked paid behind the webhook's back, and a grant
        # that names an order never paid.
        unpaid = place_order(account_id, Quote(amount=Decimal(7), fee=Decimal(0))).id
        forged = place_order(account_id, Quote(amount=Decimal(5), fee=Decimal(0)))
        forged.status = PAID
        forged_id = forged.id
        db.session.commit()
        grant_credits(account_id=account_id, amount=Decimal(7), idempotency_key=f"order:{unpaid}")
        audit = runner.invoke(args=["ledger", "audit", "--full"])
    assert audit.exit_code == 1
    assert f"order {forged_id} is paid but has no grant" in audit.stderr
    assert f"a grant names order {unpaid}, which is not paid" in audit.stderr
    assert paid_id not in audit.stderr
    assert "2 mismatches" in audit.stdout
