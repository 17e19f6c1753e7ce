"""The dashboard's ways in: sign-up, its confirmation, password links, and invite links.

A password is set only at sign-up or through a password link of the person's own (the
operator's, or one mailed to their address). Sign-up answers alike whether the address
is known or not when mail is set up; without mail it cannot prove an address, so it
creates new ones at once and refuses known ones, never touching them.
"""

from __future__ import annotations

import smtplib

from flask import current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user
from werkzeug.wrappers import Response as BaseResponse

from app.accounts.invites import (
    InviteInvalid,
    InviteNotYours,
    OpenInvite,
    accept_invite,
    find_open_invite,
    join_by_invite,
)
from app.accounts.links import (
    LinkInvalid,
    confirm_sign_up,
    find_link_person,
    pending_sign_up_email,
    request_password_reset,
    start_sign_up,
    use_password_link,
)
from app.accounts.passwords import WeakPassword, register_account
from app.credits.accounts import AccountExists
from app.dashboard.addresses import is_local_path, public_link, safe_next
from app.dashboard.forms import ForgotPasswordForm, SetPasswordForm, SignUpForm
from app.dashboard.security import ATTEMPT_LIMITS
from app.dashboard.session import start_session, switch_organisation
from app.dashboard.views import bp
from app.mail import mail_configured, send_mail
from app.ratelimits import limiter

# Without mail, a known address cannot be told apart from a new one that is refused:
# the page says so plainly rather than pretend.
CANNOT_SIGN_UP = (
    "This address cannot be signed up here. If it is yours, sign in; if you have no "
    "password yet, ask the operator of this service for a password link."
)
CLOSED_BY_INVITATION = (
    "New accounts are by invitation. Ask the operator of this service for an invite link."
)
CLOSED_WITHOUT_MAIL = (
    "Sign-up confirms each address by e-mail, and this service sends none (SMTP_URL is "
    "not set). Ask the operator of this service for an invite link."
)


def _error(title: str, message: str, status: int) -> tuple[str, int]:
    return render_template("dashboard/error.html", title=title, message=message), status


def _next_page() -> str:
    return safe_next(request.args.get("next"), url_for(".list_keys"))


def sign_up_closed_reason() -> str | None:
    """Return why sign-up is closed, or None when it is open."""
    if current_app.config["SIGNUP"] != "open":
        return CLOSED_BY_INVITATION
    if current_app.config.get("ENV_NAME") == "production" and not mail_configured():
        return CLOSED_WITHOUT_MAIL
    return None


@bp.route("/signup", methods=["GET", "POST"])
@limiter.limit(*ATTEMPT_LIMITS, methods=["POST"])
def sign_up() -> BaseResponse | str | tuple[str, int]:
    """Create an account: confirmed by e-mail when mail is set up, else at once."""
    reason = sign_up_closed_reason()
    if reason is not None:
        return render_template("dashboard/sign_up_closed.html", reason=reason), 403
    form = SignUpForm()
    if request.method == "GET" and request.args.get("email"):
        form.email.data = request.args["email"][:320]
    if form.validate_on_submit():
        if mail_configured():
            return _sign_up_by_mail(form.email.data.strip(), form.password.data)
        try:
            person = register_account(email=form.email.data, password=form.password.data)
        except AccountExists:
            form.email.errors.append(CANNOT_SIGN_UP)
        except WeakPassword as error:
            form.password.errors.append(str(error))
        else:
            start_session(person)
            return redirect(_next_page())
    return render_template("dashboard/sign_up.html", form=form), 400 if form.errors else 200


def _sign_up_by_mail(email: str, password: str) -> tuple[str, int]:
    """Mail a confirmation to a new address, a password link to a known one; answer alike."""
    token, known = start_sign_up(email, password)
    if known:
        link = public_link(".password_link_page", token=token)
        subject, body = (
            "Your account",
            (
                "Someone, perhaps you, tried to sign up with this address, which has an "
                "account already. Sign in as usual, or set a new password within an hour "
                f"with this link (it works once):\n{link}\n\nIf it was not you, ignore this."
            ),
        )
    else:
        next_page = request.args.get("next")
        local = next_page if next_page and is_local_path(next_page) else None
        link = public_link(".confirm_sign_up_page", token=token, next=local)
        subject, body = (
            "Confirm your account",
            (
                f"Open this link within 24 hours to create your account:\n{link}\n\n"
                "If you did not sign up, ignore this: nothing is created."
            ),
        )
    _send(email, subject, body)
    page = render_template("dashboard/sign_up_sent.html", email=email)
    return page, 200


def _send(email: str, subject: str, body: str) -> None:
    """Mail ``body``; a failure is logged (by its kind only) and the page answers alike."""
    try:
        send_mail(email, subject, body)
    except (smtplib.SMTPException, OSError) as error:
        current_app.logger.warning("mail not sent: %s", type(error).__name__)


@bp.route("/signup/confirm/<token>", methods=["GET", "POST"])
def confirm_sign_up_page(token: str) -> BaseResponse | str | tuple[str, int]:
    """Confirm a sign-up: the account is made on the button, not on opening the link."""
    try:
        email = pending_sign_up_email(token)
    except LinkInvalid as error:
        return _error("Sign-up", str(error), 404)
    if request.method == "GET":
        return render_template("dashboard/sign_up_confirm.html", email=email)
    try:
        person = confirm_sign_up(token)
    except LinkInvalid as error:
        return _error("Sign-up", str(error), 404)
    except AccountExists:
        return _error("Sign-up", "This address has an account already: sign in.", 409)
    start_session(person)
    return redirect(_next_page())


@bp.route("/password/<token>", methods=["GET", "POST"])
def password_link_page(token: str) -> BaseResponse | str | tuple[str, int]:
    """Set a password from a one-time password link, and sign in."""
    try:
        person = find_link_person(token)
    except LinkInvalid as error:
        return _error("Password", str(error), 404)
    form = SetPasswordForm()
    if form.validate_on_submit():
        try:
            person = use_password_link(token, form.password.data)
        except LinkInvalid as error:
            return _error("Password", str(error), 404)
        except WeakPassword as error:
            form.password.errors.append(str(error))
        else:
            start_session(person)
            return redirect(url_for(".list_keys"))
    page = render_template("dashboard/password.html", form=form, email=person.email)
    return page, 400 if form.errors else 200


@bp.route("/password/forgot", methods=["GET", "POST"])
@limiter.limit(*ATTEMPT_LIMITS, methods=["POST"])
def forgot_password() -> str | tuple[str, int]:
    """Mail a link to set a new password; the answer is the same for any address."""
    form = ForgotPasswordForm()
    if not mail_configured():
        return render_template("dashboard/forgot.html", form=form, mail=False), 404
    if form.validate_on_submit():
        email = form.email.data.strip()
        token = request_password_reset(email)
        if token is not None:
            link = public_link(".password_link_page", token=token)
            _send(
                email,
                "Set a new password",
                f"Open this link within an hour to set a new password (it works once):\n"
                f"{link}\n\nIf you did not ask for it, ignore this: nothing changes.",
            )
        flash("If an account has this address, a link to set a new password is on its way.")
        return render_template("dashboard/forgot.html", form=ForgotPasswordForm(formdata=None))
    page = render_template("dashboard/forgot.html", form=form, mail=True)
    return page, 400 if form.errors else 200


@bp.route("/invite/<token>", methods=["GET", "POST"])
def accept_invite_page(token: str) -> BaseResponse | str | tuple[str, int]:
    """Let the holder of the invited address join, once, within 24 hours.

    They sign in (or sign up) with that address, then join with one click; only an
    operator's invite lets someone without a password set one here.
    """
    try:
        invite = find_open_invite(token)
    except InviteInvalid as error:
        return _error("Invite", str(error), 404)
    if current_user.is_authenticated:
        return _join_page(token, invite)
    if invite.needs_password:
        return _set_password_page(token, invite)
    page = render_template("dashboard/invite.html", invite=invite, signed_in=False)
    return page, 403 if request.method == "POST" else 200


def _set_password_page(token: str, invite: OpenInvite) -> BaseResponse | tuple[str, int]:
    """Serve the operator's invite of someone without a password: they choose one, and join."""
    form = SetPasswordForm()
    if form.validate_on_submit():
        try:
            person = accept_invite(token, form.password.data)
        except InviteInvalid as error:
            return _error("Invite", str(error), 404)
        except WeakPassword as error:
            form.password.errors.append(str(error))
        else:
            start_session(person)
            switch_organisation(person.id, invite.account.id)
            return redirect(url_for(".list_keys"))
    page = render_template("dashboard/invite.html", form=form, invite=invite)
    return page, 400 if form.errors else 200


def _join_page(token: str, invite: OpenInvite) -> BaseResponse | tuple[str, int]:
    """Serve the invite to a signed-in person: theirs to join if it was sent to their address."""
    if request.method == "GET":
        mine = current_user.email.lower() == invite.email
        page = render_template("dashboard/invite.html", invite=invite, signed_in=True, mine=mine)
        return page, 200 if mine else 403
    try:
        joined = join_by_invite(token, current_user.person_id)
    except InviteInvalid as error:
        return _error("Invite", str(error), 404)
    except InviteNotYours as error:
        return _error("Invite", f"{error} Sign out and sign in as {invite.email}.", 403)
    switch_organisation(current_user.person_id, joined.account.id)
    flash(f"You joined {joined.account.name} as {joined.role}.", "success")
    return redirect(url_for(".list_keys"))
