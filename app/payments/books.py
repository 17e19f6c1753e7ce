"""The books of payments: each order, each take-back and each code redeemed, as a line."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import select

from app.credits.models import TAKE_BACK, Account, LedgerEntry
from app.extensions import db
from app.payments.codes import PREFIX
from app.payments.models import PaymentOrder, RedemptionCode

# A line's kind.
PAYMENT, REFUND, CODE = "payment", "refund", "code"
# The columns of the listings (flask payments list, the Balance page's export).
COLUMNS = (
    "time", "organisation", "kind", "reference", "amount_usd", "fee_usd", "status", "receipt",
)  # fmt: skip


@dataclass(frozen=True)
class BookLine:
    """A payment, a refund or dispute taken back, or a code redeemed."""

    time: datetime
    organisation: str
    kind: str
    reference: str
    amount: Decimal
    fee: Decimal
    status: str
    receipt: str | None

    def row(self) -> dict[str, object]:
        """Return the line as a listing's row, amounts as exact text."""
        return {
            "time": self.time.isoformat(),
            "organisation": self.organisation,
            "kind": self.kind,
            "reference": self.reference,
            "amount_usd": f"{self.amount:f}",
            "fee_usd": f"{self.fee:f}",
            "status": self.status,
            "receipt": self.receipt or "",
        }


def book_lines(account_id: int | None = None, limit: int = 1000) -> list[BookLine]:
    """Return the payments, take-backs and redeemed codes (of one organisation), newest first."""
    lines = _orders(account_id, limit) + _take_backs(account_id, limit) + _codes(account_id, limit)
    db.session.commit()
    return sorted(lines, key=lambda line: line.time, reverse=True)[:limit]


def _orders(account_id: int | None, limit: int) -> list[BookLine]:
    query = select(PaymentOrder, Account.name).join(Account, Account.id == PaymentOrder.account_id)
    if account_id is not None:
        query = query.where(PaymentOrder.account_id == account_id)
    query = query.order_by(PaymentOrder.created_at.desc()).limit(limit)
    return [
        BookLine(
            time=order.created_at,
            organisation=name,
            kind=PAYMENT,
            reference=order.id,
            amount=order.amount,
            fee=order.fee,
            status=order.status + (f", dispute {order.dispute}" if order.dispute else ""),
            receipt=order.receipt_url,
        )
        for order, name in db.session.execute(query)
    ]


def _take_backs(account_id: int | None, limit: int) -> list[BookLine]:
    query = (
        select(LedgerEntry, Account.name)
        .join(Account, Account.id == LedgerEntry.account_id)
        .where(LedgerEntry.kind == TAKE_BACK)
    )
    if account_id is not None:
        query = query.where(LedgerEntry.account_id == account_id)
    query = query.order_by(LedgerEntry.id.desc()).limit(limit)
    return [
        BookLine(
            time=entry.created_at,
            organisation=name,
            kind=REFUND,
            reference=entry.description or "",
            amount=entry.amount,
            fee=Decimal(0),
            status="taken back",
            receipt=None,
        )
        for entry, name in db.session.execute(query)
    ]


def _codes(account_id: int | None, limit: int) -> list[BookLine]:
    query = (
        select(RedemptionCode, Account.name)
        .join(Account, Account.id == RedemptionCode.redeemed_by)
        .where(RedemptionCode.redeemed_at.is_not(None))
    )
    if account_id is not None:
        query = query.where(RedemptionCode.redeemed_by == account_id)
    query = query.order_by(RedemptionCode.redeemed_at.desc()).limit(limit)
    return [
        BookLine(
            time=code.redeemed_at,
            organisation=name,
            kind=CODE,
            reference=PREFIX + code.id,
            amount=code.amount,
            fee=Decimal(0),
            status="redeemed",
            receipt=None,
        )
        for code, name in db.session.execute(query)
    ]
