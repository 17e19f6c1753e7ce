"""GET /v1/credits: the caller's own balance, read-only."""

from __future__ import annotations

from flask import Blueprint, Response, g

from app.auth.decorators import require_api_key
from app.credits.balances import credit_summary
from app.encoding import dumps

bp = Blueprint("credits", __name__)


@bp.get("/credits")
@require_api_key
def read_credits() -> Response:
    """Answer the account's credits granted, used and remaining, in USD."""
    summary = credit_summary(g.caller.account_id)
    body = {
        "data": {
            "total_credits": summary.granted,
            "total_usage": summary.used,
            "remaining": summary.balance,
        }
    }
    return Response(dumps(body), mimetype="application/json")
