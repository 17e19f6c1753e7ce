"""Who may do what in the dashboard: operators' pages, and how sign-in attempts are counted."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

from flask import abort, current_app, redirect, request, url_for
from flask_login import current_user, login_required

from app.accounts.members import Actor
from app.accounts.models import MEMBER, has_role
from app.accounts.passwords import normalize_email

P = ParamSpec("P")
R = TypeVar("R")


def admin_required(view: Callable[P, R]) -> Callable[P, R]:
    """Answer 404 to anyone but an operator: the page is not there for them."""

    @wraps(view)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        if not current_user.is_authenticated or not current_user.is_admin:
            abort(404)
        return view(*args, **kwargs)

    return wrapped


def current_actor() -> Actor:
    """Return the signed-in member as the membership rules take them."""
    return Actor(current_user.person_id, current_user.member_id, current_user.role)


def role_required(needed: str = MEMBER) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Let in members of the current organisation whose role is at least ``needed``.

    Strangers are sent to sign in, a person in no organisation to their organisations,
    and a member whose role is too low gets 403. Objects of another organisation are
    the views' to refuse, with 404.
    """

    def decorate(view: Callable[P, R]) -> Callable[P, R]:
        @wraps(view)
        def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
            if current_user.account_id is None:
                return redirect(url_for("dashboard.organisations"))  # type: ignore[return-value]
            if not has_role(current_user.role, needed):
                abort(403)
            return view(*args, **kwargs)

        return login_required(wrapped)

    return decorate


def sign_in_email() -> str:
    """Count sign-in attempts per email, whichever letter case it is typed in."""
    return "sign-in-email:" + normalize_email(request.form.get("email", ""))[:320]


def sign_in_address() -> str:
    """Count sign-in attempts per client address."""
    return "sign-in-address:" + (request.remote_addr or "unknown")


def sign_in_limit_per_email() -> str:
    """Return the app's limit of sign-in attempts per email."""
    return current_app.config["SIGN_IN_LIMIT_PER_EMAIL"]


def sign_in_limit_per_address() -> str:
    """Return the app's limit of sign-in attempts per client address."""
    return current_app.config["SIGN_IN_LIMIT_PER_ADDRESS"]


# Sign-in, sign-up and asking for a password link are counted alike, each form apart:
# per email and per client address.
ATTEMPT_LIMITS = (
    (sign_in_limit_per_address, sign_in_address),
    (sign_in_limit_per_email, sign_in_email),
)
