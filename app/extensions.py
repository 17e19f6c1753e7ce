"""Flask extensions, created unbound here and bound to the app in the factory."""

from typing import Any

from flask import Flask, Request, Response, request
from flask.sessions import SecureCookieSessionInterface
from flask_login import LoginManager
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from flask_wtf.csrf import CSRFProtect
from sqlalchemy import MetaData

from app.encoding import JSON_COLUMN_CODEC

# Named constraints let Alembic alter them later, SQLite included.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class DashboardLoginManager(LoginManager):
    """Flask-Login, kept to the dashboard: API requests never read the session."""

    def _update_remember_cookie(self, response: Response) -> Response:
        # Flask-Login reads the session after every request, and reading it marks the
        # answer "Vary: Cookie": API answers do not depend on cookies, and caches must
        # not think they do. Only the dashboard signs in and out. (The request itself:
        # an attribute read through Flask's proxy costs several times as much.)
        if request._get_current_object().blueprint != "dashboard":
            return response
        return super()._update_remember_cookie(response)


# Where the public API is mounted; Google's Gemini API also under its own version's path.
API_PREFIX = "/v1"
GEMINI_PREFIX = "/v1beta"
API_PATH_PREFIXES = (API_PREFIX + "/", GEMINI_PREFIX + "/")


class DashboardSessionInterface(SecureCookieSessionInterface):
    """Signed-cookie sessions for the dashboard's pages; none for the API, which has no use."""

    def open_session(self, app: Flask, request: Request) -> Any:
        """Open the cookie's session, except on the API (under API_PREFIX)."""
        # Reading the cookie builds a signing serializer on every request: work the API
        # would do for nothing on each call. The session opens before the URL is
        # matched, so the path tells, not the blueprint.
        if request.path.startswith(API_PATH_PREFIXES):
            return self.make_null_session(app)
        return super().open_session(app, request)


db = SQLAlchemy(
    metadata=MetaData(naming_convention=NAMING_CONVENTION), engine_options=JSON_COLUMN_CODEC
)
migrate = Migrate()
login_manager = DashboardLoginManager()
csrf = CSRFProtect()
