"""A caller's own generations and key: GET /v1/generations/{id}, GET /v1/key."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, g

from app.auth.decorators import require_api_key
from app.budgets import BudgetState
from app.encoding import dumps
from app.generations.lookup import find_generation_or_raise, generation_body
from app.generations.usage import key_usage

bp = Blueprint("generations", __name__)


@bp.get("/key")
@require_api_key
def read_key() -> Response:
    """Answer the calling key's name, limits, spend today and this month (UTC), budgets."""
    usage = key_usage(g.caller.key_id)
    body = {
        "data": {
            "name": usage.name,
            "display_prefix": usage.display_prefix,
            "permitted_models": usage.permitted_models,
            "limit": usage.budget.amount,
            "limit_remaining": usage.budget.remaining,
            "usage_daily": usage.spent_today,
            "usage_monthly": usage.spent_this_month,
            "budget": budget_body(usage.budget),
            "member_budget": budget_body(usage.member_budget),
            "rate_limit": current_app.config["RATE_LIMIT"],
        }
    }
    return Response(dumps(body), mimetype="application/json")


def budget_body(budget: BudgetState) -> dict[str, Any]:
    """Return a budget as GET /v1/key shows it (amount and remaining None: no budget)."""
    return {
        "amount": budget.amount,
        "window": budget.window,
        "window_start": budget.window_start.isoformat(),
        "resets_at": budget.resets_at.isoformat(),
        "spent": budget.spent,
        "reserved": budget.reserved,
        "remaining": budget.remaining,
    }


@bp.get("/generations/<generation_id>")
@require_api_key
def read_generation(generation_id: str) -> Response:
    """Answer one of the caller's generations: tokens, cost, timings, upstreams tried."""
    generation = find_generation_or_raise(
        account_id=g.caller.account_id, generation_id=generation_id
    )
    return Response(dumps({"data": generation_body(generation)}), mimetype="application/json")
