"""Liveness and readiness probes for the platform; neither needs a key."""

from __future__ import annotations

from flask import Blueprint, Response
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from app.encoding import dumps
from app.errors import APIError, error_response
from app.extensions import db
from app.ratelimits import rate_limit_store_reachable

bp = Blueprint("health", __name__)


class DatabaseUnavailable(APIError):
    """The database does not answer (503)."""

    status = 503
    type = "api_error"
    code = "database_unavailable"
    default_message = "The database is not reachable."


@bp.get("/healthz")
def healthz() -> Response:
    """Answer 200 while the process is up."""
    return Response(dumps({"status": "ok"}), mimetype="application/json")


@bp.get("/readyz")
def readyz() -> Response:
    """Answer 200 only when the database answers; say "degraded" when Redis does not.

    Without Redis the service still serves (rate limits count per worker), so taking the
    instance out of rotation would turn a Redis outage into a full one.
    """
    try:
        db.session.execute(text("SELECT 1"))
        db.session.commit()
    except SQLAlchemyError:
        db.session.rollback()
        return error_response(DatabaseUnavailable())
    if rate_limit_store_reachable() is False:
        return Response(
            dumps({"status": "degraded", "redis": "unreachable"}), mimetype="application/json"
        )
    return Response(dumps({"status": "ready"}), mimetype="application/json")
