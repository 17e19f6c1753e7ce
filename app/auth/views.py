"""GET /v1/key: the calling key's name, limits and spend."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g

from app.auth.decorators import require_api_key
from app.auth.usage import key_usage
from app.encoding import dumps

bp = Blueprint("keys", __name__)


@bp.get("/key")
@require_api_key
def read_key() -> Response:
    """Answer the calling key's name, limits, and spend today and this month (UTC), in USD."""
    usage = key_usage(g.caller.key_id)
    body = {
        "data": {
            "name": usage.name,
            "display_prefix": usage.display_prefix,
            "permitted_models": usage.permitted_models,
            "limit": usage.monthly_limit,
            "limit_remaining": usage.limit_remaining,
            "usage_daily": usage.spent_today,
            "usage_monthly": usage.spent_this_month,
            "rate_limit": current_app.config["RATE_LIMIT"],
        }
    }
    return Response(dumps(body), mimetype="application/json")
