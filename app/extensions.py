"""Flask extensions, created unbound here and bound to the app in the factory."""

from flask import Response, request
from flask_login import LoginManager
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from flask_wtf.csrf import CSRFProtect
from sqlalchemy import MetaData

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
        # not think they do. Only the dashboard signs in and out.
        if request.blueprint != "dashboard":
            return response
        return super()._update_remember_cookie(response)


db = SQLAlchemy(metadata=MetaData(naming_convention=NAMING_CONVENTION))
migrate = Migrate()
login_manager = DashboardLoginManager()
csrf = CSRFProtect()
