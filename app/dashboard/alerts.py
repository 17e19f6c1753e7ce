"""The dashboard's Alerts page: the balance and budget thresholds, endpoints, the log.

Owners and admins only. A webhook's signing secret is shown once, on the page that
answers its creation; the page never shows it again.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from flask import abort, flash, redirect, render_template, url_for
from flask_login import current_user
from flask_wtf import FlaskForm
from werkzeug.wrappers import Response as BaseResponse
from wtforms import StringField

from app.accounts.models import ADMIN
from app.alerts.endpoints import (
    EndpointNotFound,
    InvalidAlertSetting,
    active_endpoints,
    add_email,
    add_webhook,
    balance_threshold,
    budget_alert_percent,
    delivery_log,
    remove_endpoint,
    set_balance_threshold,
    set_budget_alert_percent,
)
from app.dashboard.security import role_required
from app.dashboard.views import bp


class ThresholdForm(FlaskForm):
    """The balance under which the organisation is alerted (blank: no alert)."""

    below = StringField("Alert when the balance falls below (USD)", description="Blank: none.")


class BudgetAlertForm(FlaskForm):
    """The share of a budget at which the organisation is alerted (blank: when used up)."""

    percent = StringField(
        "Alert when a budget reaches (% of it)", description="1 to 99. Blank: only when used up."
    )


class EndpointForm(FlaskForm):
    """A webhook URL or an e-mail address."""

    target = StringField("Webhook URL or e-mail address")


def _alerts_page(status: int = 200, secret: str | None = None) -> tuple[str, int]:
    account_id = current_user.account_id
    page = render_template(
        "dashboard/alerts.html",
        threshold=balance_threshold(account_id),
        budget_percent=budget_alert_percent(account_id),
        endpoints=active_endpoints(account_id),
        deliveries=delivery_log(account_id),
        threshold_form=ThresholdForm(),
        budget_form=BudgetAlertForm(),
        endpoint_form=EndpointForm(formdata=None),  # a URL may carry a password
        secret=secret,
    )
    return page, status


@bp.get("/alerts")
@role_required(ADMIN)
def alerts() -> tuple[str, int]:
    """Show the organisation's alert settings and delivery log."""
    return _alerts_page()


@bp.post("/alerts/balance")
@role_required(ADMIN)
def set_alert_threshold() -> tuple[str, int] | BaseResponse:
    """Set or clear the balance threshold."""
    form = ThresholdForm()
    if not form.validate_on_submit():
        abort(400)
    text = (form.below.data or "").strip()
    try:
        usd = Decimal(text) if text else None
        set_balance_threshold(current_user.account_id, usd, actor=current_user.person_id)
    except (InvalidOperation, InvalidAlertSetting):
        flash("The threshold must be a positive amount of USD.", "error")
        return _alerts_page(400)
    return redirect(url_for("dashboard.alerts"))


@bp.post("/alerts/budgets")
@role_required(ADMIN)
def set_budget_alert() -> tuple[str, int] | BaseResponse:
    """Set or clear the share of a budget at which the organisation is alerted."""
    form = BudgetAlertForm()
    if not form.validate_on_submit():
        abort(400)
    text = (form.percent.data or "").strip()
    try:
        percent = int(text) if text else None
        set_budget_alert_percent(current_user.account_id, percent, actor=current_user.person_id)
    except (ValueError, InvalidAlertSetting):
        flash("The percentage must be a whole number from 1 to 99.", "error")
        return _alerts_page(400)
    return redirect(url_for("dashboard.alerts"))


@bp.post("/alerts/endpoints")
@role_required(ADMIN)
def add_alert_endpoint() -> tuple[str, int] | BaseResponse:
    """Add a webhook (its secret is shown on the answer, once) or an e-mail recipient."""
    form = EndpointForm()
    if not form.validate_on_submit():
        abort(400)
    target = (form.target.data or "").strip()
    account_id, actor = current_user.account_id, current_user.person_id
    try:
        if target.startswith(("http://", "https://")):
            _, secret = add_webhook(account_id, target, actor=actor)
            return _alerts_page(201, secret=secret)
        add_email(account_id, target, actor=actor)
    except InvalidAlertSetting as error:
        flash(str(error).capitalize() + ".", "error")
        return _alerts_page(400)
    return redirect(url_for("dashboard.alerts"))


@bp.post("/alerts/endpoints/<int:endpoint_id>/remove")
@role_required(ADMIN)
def remove_alert_endpoint(endpoint_id: int) -> BaseResponse:
    """Stop sending alerts to an endpoint of this organisation."""
    if not FlaskForm().validate_on_submit():
        abort(400)
    try:
        remove_endpoint(current_user.account_id, endpoint_id, actor=current_user.person_id)
    except EndpointNotFound:
        abort(404)
    return redirect(url_for("dashboard.alerts"))
