"""The signed-in account holder, as Flask-Login keeps them in the session cookie."""

from __future__ import annotations

from flask import Flask, session
from flask_login import UserMixin, login_user

from app.credits.models import Account
from app.extensions import DashboardSessionInterface, db, login_manager


class DashboardUser(UserMixin):
    """The account a dashboard session belongs to."""

    def __init__(self, account: Account) -> None:
        self.account_id = account.id
        self.email = account.email
        self.is_admin = account.is_admin

    def get_id(self) -> str:
        """Return what the session cookie records: the account's id."""
        return str(self.account_id)


def load_user(user_id: str) -> DashboardUser | None:
    """Return the session's holder, or None if the account is gone."""
    try:
        account = db.session.get(Account, int(user_id))
    except ValueError:
        return None
    return DashboardUser(account) if account else None


def start_session(account: Account) -> None:
    """Sign ``account`` in with a fresh session, so no earlier session state carries over."""
    session.clear()
    login_user(DashboardUser(account))


def init_sessions(app: Flask) -> None:
    """Bind the dashboard's cookie sessions and Flask-Login (pages send strangers to sign in)."""
    app.session_interface = DashboardSessionInterface()
    login_manager.init_app(app)
    login_manager.user_loader(load_user)
    login_manager.login_view = "dashboard.sign_in"
    login_manager.login_message = "Sign in to see that page."
    login_manager.login_message_category = "info"
