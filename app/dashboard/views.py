"""The dashboard's pages: each view parses, calls the domain, and renders."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Sequence
from datetime import date
from typing import Any

from flask import (
    Blueprint,
    Response,
    abort,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    stream_with_context,
    url_for,
)
from flask_login import current_user, login_required, logout_user
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import Forbidden, MethodNotAllowed, NotFound
from werkzeug.wrappers import Response as BaseResponse

from app.accounts import keys, members
from app.accounts.budgets import set_key_budget
from app.accounts.changes import record_change
from app.accounts.errors import InvalidKeyLimits
from app.accounts.members import has_role
from app.accounts.models import ADMIN
from app.accounts.organisations import organisation_label
from app.accounts.passwords import authenticate
from app.auth.models import ApiKey
from app.budgets import MONTH
from app.catalog.registry import current_catalog
from app.credits.errors import IdempotencyConflict
from app.credits.grants import grant_credits
from app.dashboard import accounts, usage
from app.dashboard.addresses import safe_next
from app.dashboard.charts import spend_chart
from app.dashboard.formatting import (
    NEEDS_QUOTES,
    csv_cell,
    csv_text,
    current_window,
    format_usd,
    usd_places,
    window_name,
)
from app.dashboard.forms import (
    CreateKeyForm,
    ForgotPasswordForm,
    GrantForm,
    KeyLimitsForm,
    SignInForm,
    SignUpForm,
)
from app.dashboard.pages import Cursor
from app.dashboard.quickstart import client_configurations
from app.dashboard.security import ATTEMPT_LIMITS, admin_required, current_actor, role_required
from app.dashboard.session import start_session
from app.database import utcnow
from app.errors import handle_http_exception
from app.extensions import API_PATH_PREFIXES, API_PREFIX, csrf, db
from app.ratelimits import RateLimitExceeded, limiter

bp = Blueprint(
    "dashboard",
    __name__,
    template_folder="templates",
    static_folder="static",
    static_url_path="/dashboard/static",
)
bp.add_app_template_filter(format_usd, "usd")
bp.add_app_template_filter(usd_places, "usd_places")
bp.add_app_template_filter(window_name, "window_name")
bp.add_app_template_filter(current_window, "current_window")
bp.add_app_template_global(organisation_label, "organisation_label")
CHART_DAYS = 30
# The generations list's place, carried by its Newer and Older links beside the filter.
PAGING_ARGS = ("before", "after")
CSV_COLUMNS = (
    "time", "id", "model", "api", "key", "prompt_tokens", "cached_tokens", "completion_tokens",
    "reasoning_tokens", "cost_usd", "latency_ms", "status", "streamed", "estimated",
)  # fmt: skip
CSV_HEADER = ",".join(CSV_COLUMNS) + "\r\n"
# What makes csv.writer quote a cell: its delimiter, its quote, a line end.


@bp.before_request
def protect_forms() -> None:
    """Refuse a form posted without its CSRF token (400), before any view runs."""
    csrf.protect()


@bp.after_request
def set_security_headers(response: Response) -> Response:
    """Forbid framing, inline scripts, foreign referrers, and caching of private pages."""
    # A page whose form leads elsewhere (the Balance page's, to Stripe Checkout) names where.
    form_action = " ".join(["'self'", *g.get("form_action_targets", ())])
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        f"object-src 'none'; base-uri 'none'; form-action {form_action}; frame-ancestors 'none'"
    )
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["X-Content-Type-Options"] = "nosniff"
    if request.endpoint != "dashboard.static":
        response.headers["Cache-Control"] = "no-store"
    return response


@bp.errorhandler(CSRFError)
def refuse_without_csrf(error: CSRFError) -> tuple[str, int]:
    """Answer 400 with a page saying the form expired."""
    message = "The form was missing its security token or it expired. Go back and try again."
    return render_template("dashboard/error.html", title="Bad request", message=message), 400


@bp.errorhandler(NotFound)
def not_found(error: NotFound) -> tuple[str, int]:
    """Answer 404 with a page: another account's key is no key."""
    message = "There is nothing here, or it is not yours."
    return render_template("dashboard/error.html", title="Not found", message=message), 404


@bp.errorhandler(Forbidden)
def forbidden(error: Forbidden) -> tuple[str, int]:
    """Answer 403 with a page: the member's role does not allow this."""
    message = "Your role in this organisation does not allow this. Ask an admin or owner."
    return render_template("dashboard/error.html", title="Not allowed", message=message), 403


@bp.errorhandler(RateLimitExceeded)
def too_many_requests(error: RateLimitExceeded) -> tuple[str, int]:
    """Answer 429: on the form's own page for attempts at it, on an error page otherwise."""
    attempts = {
        "dashboard.sign_in": ("dashboard/sign_in.html", SignInForm, "sign-in attempts"),
        "dashboard.sign_up": ("dashboard/sign_up.html", SignUpForm, "sign-up attempts"),
        "dashboard.forgot_password": ("dashboard/forgot.html", ForgotPasswordForm, "requests"),
    }
    if request.endpoint in attempts:
        template, form, counted = attempts[request.endpoint]
        flash(f"Too many {counted}. Wait a few minutes and try again.", "error")
        return render_template(template, form=form(formdata=None), mail=True), 429
    message = "Too many requests from your address. Wait a minute and try again."
    return render_template("dashboard/error.html", title="Slow down", message=message), 429


# Paths the API's clients call: their errors stay JSON, in their door's envelope, whatever
# their Accept header says (a client may well accept text/html).
API_PATHS = (*API_PATH_PREFIXES, "/healthz", "/readyz", "/metrics")


def wants_a_page() -> bool:
    """Return whether the request is a browser's for a page: not an API path, HTML first.

    A browser asks for ``text/html`` before anything else; the SDKs, curl and the probes
    ask for JSON or ``*/*``, and get the API's JSON envelope.
    """
    if request.path == API_PREFIX or request.path.startswith(API_PATHS):
        return False
    return request.accept_mimetypes.best_match(("application/json", "text/html")) == "text/html"


@bp.app_errorhandler(NotFound)
@bp.app_errorhandler(MethodNotAllowed)
def page_or_envelope(error: NotFound | MethodNotAllowed) -> Response:
    """Answer a browser lost outside the dashboard with its error page, an API client in JSON."""
    if not wants_a_page():
        return handle_http_exception(error)
    if isinstance(error, MethodNotAllowed):
        title, message = "Not allowed", "This page cannot be used that way. Go back and try again."
    else:
        title, message = "Not found", "There is no page at this address."
    page = render_template("dashboard/error.html", title=title, message=message)
    return set_security_headers(Response(page, error.code, mimetype="text/html"))


@bp.get("/")
def home() -> BaseResponse:
    """Send holders to their keys, everyone else to sign in."""
    return redirect(url_for(".list_keys" if current_user.is_authenticated else ".sign_in"))


@bp.route("/signin", methods=["GET", "POST"])
@limiter.limit(*ATTEMPT_LIMITS, methods=["POST"])
def sign_in() -> BaseResponse | str | tuple[str, int]:
    """Sign in with email and password; one message for whatever was wrong."""
    form = SignInForm()
    if form.validate_on_submit():
        person = authenticate(form.email.data, form.password.data)
        if person is not None:
            start_session(person)
            return redirect(safe_next(request.args.get("next"), url_for(".list_keys")))
        flash("Incorrect email or password.", "error")
        return render_template("dashboard/sign_in.html", form=form), 401
    return render_template("dashboard/sign_in.html", form=form)


@bp.get("/signout")
def confirm_sign_out() -> BaseResponse | str:
    """Offer the sign-out button: signing out is a form posted with its CSRF token."""
    if not current_user.is_authenticated:
        return redirect(url_for(".sign_in"))
    return render_template("dashboard/sign_out.html")


@bp.post("/signout")
def sign_out() -> BaseResponse:
    """End the session."""
    logout_user()
    session.clear()
    return redirect(url_for(".sign_in"))


def _model_choices() -> list[tuple[str, str]]:
    return [(model.id, model.id) for model in current_catalog().list()]


def _sees_every_key() -> bool:
    """Whether the signed-in member manages every member's keys (an admin or owner)."""
    return has_role(current_user.role, ADMIN)


def _own_member_id() -> int | None:
    """Return the member whose keys alone the signed-in member sees; None: they see all."""
    return None if _sees_every_key() else current_user.member_id


def _keys_page(form: CreateKeyForm, status: int = 200) -> tuple[str, int]:
    rows = accounts.account_key_rows(current_user.account_id, utcnow(), _own_member_id())
    page = render_template(
        "dashboard/keys.html",
        rows=rows,
        form=form,
        every_member=_sees_every_key(),
        manageable=_manageable_members(),
    )
    return page, status


def _create_key_form() -> CreateKeyForm:
    """Return the form to create a key: for an admin or owner, for any current member."""
    form = CreateKeyForm()
    form.permitted_models.choices = _model_choices()
    if not _sees_every_key():
        del form.member
        return form
    current = members.list_members(current_user.account_id)
    actor = current_actor()
    form.member.choices = [
        (row.membership.id, row.email)
        for row in current
        if members.may_manage_keys_of(actor, row.membership)
    ]
    if form.member.data is None:
        form.member.data = current_user.member_id
    return form


@bp.get("/keys")
@role_required()
def list_keys() -> tuple[str, int]:
    """List the account's keys, with the form to create one."""
    return _keys_page(_create_key_form())


@bp.post("/keys")
@role_required()
def create_key() -> tuple[str, int]:
    """Create a named key, for its creator or the member an admin chose; show its value once."""
    form = _create_key_form()
    if not form.validate():
        return _keys_page(form, 400)
    try:
        issued = keys.create_key(
            account_id=current_user.account_id,
            member_id=form.member.data if "member" in form else current_user.member_id,
            name=form.name.data.strip(),
            permitted_models=form.permitted_models.models,
            monthly_limit=form.monthly_limit.amount,
            actor=current_user.person_id,
        )
        _set_limit_window(issued.id, form)
    except InvalidKeyLimits as error:
        form.permitted_models.errors.append(str(error))
        return _keys_page(form, 400)
    key = accounts.find_account_key(current_user.account_id, issued.id)
    page = render_template("dashboard/key_value.html", key=key, value=issued.value, rotated=False)
    return page, 201


def _owned_key_or_404(key_id: int) -> ApiKey:
    """Return the organisation's key: 404 if it is another's, 403 if not the user's to manage."""
    key = accounts.find_account_key(current_user.account_id, key_id)
    if key is None:
        abort(404)
    if not members.may_manage_keys_of(current_actor(), accounts.key_member(key)):
        abort(403)
    return key


def _manageable_members() -> set[int]:
    """Return the ids of the memberships whose keys the signed-in member may manage."""
    actor = current_actor()
    return {
        membership.id
        for membership in accounts.memberships(current_user.account_id)
        if members.may_manage_keys_of(actor, membership)
    }


@bp.get("/keys/<int:key_id>/rotate")
@role_required()
def confirm_rotate(key_id: int) -> str:
    """Ask before rotating: the old value stops working at once."""
    return render_template("dashboard/confirm.html", key=_owned_key_or_404(key_id), action="Rotate")


@bp.post("/keys/<int:key_id>/rotate")
@role_required()
def rotate_key(key_id: int) -> str:
    """Give the key a new value, shown this once; the old one fails at once."""
    key = _owned_key_or_404(key_id)
    issued = keys.rotate_key(key.id, actor=current_user.person_id)
    return render_template("dashboard/key_value.html", key=key, value=issued.value, rotated=True)


@bp.post("/keys/<int:key_id>/revoke")
@role_required()
def revoke_key(key_id: int) -> BaseResponse:
    """Revoke the key: kept and listed, but refused."""
    key = _owned_key_or_404(key_id)
    keys.revoke_key(key.id, actor=current_user.person_id)
    flash(f"Revoked the key {key.name}.", "success")
    return redirect(url_for(".list_keys"))


@bp.route("/keys/<int:key_id>/edit", methods=["GET", "POST"])
@role_required()
def edit_key(key_id: int) -> BaseResponse | tuple[str, int]:
    """Change the models a key may use and its monthly spend limit."""
    key = _owned_key_or_404(key_id)
    form = KeyLimitsForm(data=_limits_data(key) if request.method == "GET" else None)
    form.permitted_models.choices = _model_choices()
    if form.validate_on_submit():
        try:
            keys.update_key_limits(
                key.id,
                permitted_models=form.permitted_models.models,
                monthly_limit=form.monthly_limit.amount,
                window=form.limit_window.data,
                actor=current_user.person_id,
            )
        except InvalidKeyLimits as error:
            form.permitted_models.errors.append(str(error))
        else:
            flash(f"Saved the limits of the key {key.name}.", "success")
            return redirect(url_for(".list_keys"))
    status = 400 if form.errors else 200
    return render_template("dashboard/key_edit.html", key=key, form=form), status


def _set_limit_window(key_id: int, form: KeyLimitsForm) -> None:
    """Count the key's limit in the window chosen (the month is the limit's own)."""
    if form.limit_window.data != MONTH:
        set_key_budget(
            key_id,
            amount=form.monthly_limit.amount,
            window=form.limit_window.data,
            actor=current_user.person_id,
        )


def _limits_data(key: ApiKey) -> dict[str, object]:
    limit = key.budget
    return {
        "permitted_models": key.permitted_models or [],
        "monthly_limit": "" if limit is None else f"{limit.normalize():f}",
        "limit_window": key.budget_window,
    }


@bp.get("/keys/<int:key_id>/delete")
@role_required()
def confirm_delete(key_id: int) -> str:
    """Ask before deleting: it cannot be undone."""
    return render_template("dashboard/confirm.html", key=_owned_key_or_404(key_id), action="Delete")


@bp.post("/keys/<int:key_id>/delete")
@role_required()
def delete_key(key_id: int) -> BaseResponse:
    """Delete the key for good."""
    key = _owned_key_or_404(key_id)
    name = key.name
    keys.delete_key(key.id, actor=current_user.person_id)
    flash(f"Deleted the key {name}.", "success")
    return redirect(url_for(".list_keys"))


def _usage_filter() -> usage.UsageFilter:
    def day(name: str) -> date | None:
        try:
            return date.fromisoformat(request.args.get(name, ""))
        except ValueError:
            return None

    own = _own_member_id()
    return usage.UsageFilter(
        key_id=request.args.get("key", type=int),
        model=request.args.get("model") or None,
        since=day("from"),
        until=day("to"),
        key_ids=None if own is None else usage.member_key_ids(own),
    )


@bp.get("/usage")
@role_required()
def usage_page() -> str:
    """Show daily spend per model, totals per model and key, and the generations."""
    account_id, chosen, today = current_user.account_id, _usage_filter(), utcnow().date()
    totalled = usage.with_dates(chosen, days=CHART_DAYS, today=today)
    totals = usage.rolled_up(account_id, totalled)
    # The chart shows the last CHART_DAYS whatever the filter but the keys: as the
    # totals, unless a key, a model or dates are chosen.
    charted = usage.UsageFilter(key_ids=chosen.key_ids)
    charted = usage.with_dates(charted, days=CHART_DAYS, today=today)
    spend = (totals if charted == totalled else usage.rolled_up(account_id, charted)).daily_spend()
    by_model = totals.by_model()
    used = {total.label for total in by_model} | {chosen.model} - {None}
    return render_template(
        "dashboard/usage.html",
        chart=spend_chart(spend, days=CHART_DAYS, today=today),
        chosen=chosen,
        totalled=totalled,
        by_model=by_model,
        by_key=totals.by_key(),
        by_member=totals.by_member() if _sees_every_key() else None,
        page=usage.generations_page(
            account_id,
            chosen,
            before=Cursor.parse(request.args.get("before")),
            after=Cursor.parse(request.args.get("after")),
        ),
        keys=accounts.account_keys(account_id, _own_member_id()),
        models=sorted(used | {model for model, _ in _model_choices()}),
        filter_args={k: v for k, v in request.args.items() if k not in PAGING_ARGS and v},
    )


def _csv_lines(account_id: int, chosen: usage.UsageFilter) -> Iterator[str]:
    """Yield the CSV's header, then its rows a batch at a time: one write per batch."""
    names = {
        key_id: csv_cell(csv_text(name)) for key_id, name in usage.key_names(account_id).items()
    }
    yield CSV_HEADER
    for batch in usage.generation_batches(account_id, chosen):
        yield _csv_batch(batch, names)


class _Cells(dict):
    """Each text's cell, spelled once: a batch repeats a few models, apis and statuses."""

    def __init__(self, spell: Callable[[str], str] = csv_cell) -> None:
        super().__init__()
        self.spell = spell

    def __missing__(self, value: str) -> str:
        cell = self[value] = self.spell(value)
        return cell


def _csv_batch(rows: Sequence[Any], names: dict[int, str]) -> str:
    """Return the CSV lines of a batch of usage.generation_batches' rows.

    The database spelled the time, the counts and cost, and the flags; the texts that
    may need quoting are quoted here, each distinct one once a batch.
    """
    models = _Cells(lambda model: csv_cell(csv_text(model)))
    cells, quoted = _Cells(), NEEDS_QUOTES.search
    return "".join([
        f"{time},{csv_cell(gid) if quoted(gid) else gid},{models[model]},{cells[api]},"
        f"{names.get(key_id, '')},{counts},{cells[status]},{flags}\r\n"
        for time, gid, model, api, key_id, counts, status, flags in rows
    ])  # fmt: skip


@bp.get("/usage.csv")
@role_required()
def usage_csv() -> Response:
    """Export the filtered generations as CSV."""
    body = stream_with_context(_csv_lines(current_user.account_id, _usage_filter()))
    filename = f"usage-{utcnow().date().isoformat()}.csv"
    return Response(
        body,
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@bp.get("/quickstart")
@login_required
def quickstart() -> str:
    """Show each door's address and every client's configuration, ready to copy."""
    models = [model.id for model in current_catalog().list()]
    root_url = request.host_url.rstrip("/")
    return render_template(
        "dashboard/quickstart.html",
        root_url=root_url,
        base_url=root_url + API_PREFIX,
        models=models,
        configurations=client_configurations(root_url, models[0] if models else "MODEL"),
    )


@bp.get("/admin/accounts")
@login_required
@admin_required
def admin_accounts() -> str:
    """List every account, each with a form to grant credits (operators only)."""
    page = accounts.accounts_page(request.args.get("page", 1, type=int))
    return render_template("dashboard/admin_accounts.html", page=page, new_form=_grant_form)


def _grant_form() -> GrantForm:
    form = GrantForm(formdata=None)
    form.idempotency_key.data = secrets.token_hex(16)
    return form


@bp.post("/admin/accounts/<int:account_id>/grant")
@login_required
@admin_required
def grant(account_id: int) -> BaseResponse | tuple[str, int]:
    """Grant credits to an account, once however often the form is submitted."""
    account = accounts.find_account(account_id) or abort(404)
    form = GrantForm()
    if not form.validate():
        errors = "; ".join(e for field in form for e in field.errors)
        return render_template("dashboard/error.html", title="Grant", message=errors), 400
    try:
        _, applied = grant_credits(
            account_id=account.id,
            amount=form.amount.amount,
            idempotency_key=f"dashboard:{form.idempotency_key.data}",
            description=form.note.data or None,
            granted_by=current_user.email,
        )
    except IdempotencyConflict:
        applied = False
    if applied:
        detail = {"amount": f"{form.amount.amount:f}", "note": form.note.data or None}
        record_change(current_user.person_id, account.id, "credits.grant", "balance", detail)
        db.session.commit()
    state = "Granted" if applied else "Already granted"
    flash(f"{state} ${form.amount.amount:f} to {account.name}.", "success")
    return redirect(url_for(".admin_accounts"))
