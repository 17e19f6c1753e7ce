"""Who may do what in the dashboard: operators' pages, and how sign-in attempts are counted."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

from flask import abort, current_app, request
from flask_login import current_user

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
