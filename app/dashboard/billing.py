"""The dashboard's Balance page: the balance, buying credits, redeeming codes, the books.

Every member sees the balance; owners and admins also see the ledger, its signed
statements (app.dashboard.statements) and the payments, buy credits through Stripe
Checkout and redeem codes. Buying needs STRIPE_SECRET_KEY: without it the page says
buying is not set up. An order is paid only when Stripe's webhook says so: its return
page says "pending" until then, and reloads itself.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import (
    Response,
    abort,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_login import current_user
from flask_wtf import FlaskForm
from werkzeug.wrappers import Response as BaseResponse
from wtforms import BooleanField, StringField
from wtforms.validators import DataRequired, Length

from app.accounts.members import has_role
from app.accounts.models import ADMIN
from app.dashboard import accounts
from app.dashboard.addresses import public_link
from app.dashboard.formatting import csv_cell, csv_text
from app.dashboard.security import role_required
from app.dashboard.views import bp
from app.database import utcnow
from app.ledger_statements.statement import statement_periods
from app.payments.books import COLUMNS, book_lines
from app.payments.codes import CodeRefused, redeem
from app.payments.models import PENDING
from app.payments.orders import (
    CheckoutUnavailable,
    InvalidAmount,
    find_order,
    place_order,
    quote,
    start_checkout,
    topup_bounds,
    usd_in_cents,
)
from app.payments.stripe_api import buying_enabled
from app.payments.topups import configure, topup_of

# How soon a pending order's page loads itself again.
ORDER_REFRESH_SECONDS = 2
# Where Stripe's hosted Checkout pages are: the Balance page's form may lead there.
STRIPE_CHECKOUT = "https://checkout.stripe.com"


class BuyCreditsForm(FlaskForm):
    """How many USD of credits to buy, and whether to keep the card for auto top-up."""

    amount = StringField("Amount (USD)", validators=[DataRequired(), Length(max=20)])
    save_card = BooleanField("Save the card for auto top-up")


class AutoTopupForm(FlaskForm):
    """When auto top-up buys, how much, and whether it is on."""

    threshold = StringField(
        "Top up when the balance falls below (USD)", validators=[DataRequired(), Length(max=20)]
    )
    amount = StringField("Top-up amount (USD)", validators=[DataRequired(), Length(max=20)])
    enabled = BooleanField("Auto top-up on")


class RedeemForm(FlaskForm):
    """A redemption code."""

    code = StringField("Code", validators=[DataRequired(), Length(max=200)])


@bp.get("/balance")
@role_required()
def balance() -> str:
    """Show the balance; to owners and admins also the ledger, payments and the forms."""
    return _balance_page()


def _balance_page(status: int = 200) -> tuple[str, int]:
    account = accounts.find_account(current_user.account_id)
    manages = has_role(current_user.role, ADMIN)
    if manages:
        _allow_checkout_form()
    page = accounts.ledger_page(account.id, request.args.get("page", 1, type=int))
    html = render_template(
        "dashboard/balance.html",
        account=account,
        page=page if manages else None,
        manages=manages,
        buying=buying_enabled(),
        bounds=topup_bounds(),
        buy_form=BuyCreditsForm(),
        redeem_form=RedeemForm(formdata=None),  # a code is a secret: never shown back
        lines=book_lines(account.id, limit=50) if manages else [],
        topup=topup_of(account.id) if manages else None,
        topup_form=_topup_form(account.id) if manages else None,
        statements=statement_periods(account, utcnow()) if manages else [],
    )
    return html, status


def _allow_checkout_form() -> None:
    """Let the page's form lead to Stripe Checkout (the CSP's form-action)."""
    targets = [STRIPE_CHECKOUT]
    base = current_app.config.get("STRIPE_API_BASE")
    if base:
        parts = urlsplit(base)
        targets.append(f"{parts.scheme}://{parts.netloc}")
    g.form_action_targets = targets


@bp.post("/balance/credits")
@role_required(ADMIN)
def buy_credits() -> tuple[str, int] | BaseResponse:
    """Place a pending order and send its buyer to Stripe Checkout to pay it."""
    form = BuyCreditsForm()
    if not buying_enabled():
        flash("Buying credits is not set up on this gateway.", "error")
        return _balance_page(409)
    if not form.validate_on_submit():
        flash("Give the amount of USD to buy.", "error")
        return _balance_page(400)
    try:
        priced = quote(form.amount.data)
    except InvalidAmount as refused:
        flash(str(refused), "error")
        return _balance_page(400)
    order = place_order(current_user.account_id, priced)
    try:
        checkout = start_checkout(
            order,
            success_url=public_link("dashboard.order_status", order_id=order.id),
            cancel_url=public_link("dashboard.balance"),
            email=current_user.email,
            save_card=form.save_card.data,
        )
    except CheckoutUnavailable:
        flash("Stripe could not start the payment; nothing was charged. Try again.", "error")
        return _balance_page(502)
    return redirect(checkout, code=303)


def _topup_form(account_id: int) -> AutoTopupForm:
    """Return the auto top-up form, filled with the organisation's settings (if any)."""
    topup = topup_of(account_id)
    if topup is None or topup.threshold is None:
        return AutoTopupForm(formdata=None)
    return AutoTopupForm(
        formdata=None,
        threshold=f"{topup.threshold:.2f}",
        amount=f"{topup.amount:.2f}",
        enabled=topup.enabled,
    )


@bp.post("/balance/auto-topup")
@role_required(ADMIN)
def set_auto_topup() -> tuple[str, int] | BaseResponse:
    """Set the auto top-up's threshold and amount, and turn it on or off."""
    form = AutoTopupForm()
    if not buying_enabled():
        flash("Buying credits is not set up on this gateway.", "error")
        return _balance_page(409)
    if not form.validate_on_submit():
        flash("Give the threshold and the amount in USD.", "error")
        return _balance_page(400)
    try:
        configure(
            current_user.account_id,
            enabled=form.enabled.data,
            threshold=usd_in_cents(form.threshold.data),
            amount=usd_in_cents(form.amount.data),
        )
    except InvalidAmount as refused:
        flash(str(refused), "error")
        return _balance_page(400)
    flash("Auto top-up saved.", "success")
    return redirect(url_for("dashboard.balance"), code=303)


@bp.get("/balance/orders/<order_id>")
@role_required(ADMIN)
def order_status(order_id: str) -> tuple[str, int, dict[str, str]]:
    """Say where the order stands: pending until Stripe's webhook says it is paid.

    A pending order's page asks the browser to load it again in a few seconds.
    """
    order = find_order(current_user.account_id, order_id)
    if order is None:
        abort(404)
    account = accounts.find_account(current_user.account_id)
    headers = {"Refresh": str(ORDER_REFRESH_SECONDS)} if order.status == PENDING else {}
    return render_template("dashboard/order.html", order=order, account=account), 200, headers


@bp.get("/balance/payments.csv")
@role_required(ADMIN)
def payments_csv() -> Response:
    """Export the organisation's payments, take-backs and codes redeemed as CSV."""
    lines = book_lines(current_user.account_id)
    body = ",".join(COLUMNS) + "\r\n"
    body += "".join(
        ",".join(csv_cell(csv_text(str(cell))) for cell in line.row().values()) + "\r\n"
        for line in lines
    )
    filename = f"payments-{utcnow().date().isoformat()}.csv"
    return Response(
        body,
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@bp.post("/balance/redeem")
@role_required(ADMIN)
def redeem_code() -> tuple[str, int] | BaseResponse:
    """Grant a redemption code's credit to the organisation."""
    form = RedeemForm()
    if not form.validate_on_submit():
        flash("Give the code to redeem.", "error")
        return _balance_page(400)
    try:
        code = redeem(current_user.account_id, form.code.data)
    except CodeRefused as refused:
        flash(str(refused), "error")
        return _balance_page(400)
    flash(f"Redeemed: ${code.amount:.2f} of credits added.", "success")
    return redirect(url_for("dashboard.balance"), code=303)
