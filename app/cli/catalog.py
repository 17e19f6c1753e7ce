"""``flask catalog list``: the served models, their prices and routes."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from decimal import Decimal

import click

from app.catalog.registry import Model, current_catalog
from app.cli.common import JSON_OPTION, OperatorGroup
from app.providers.base import Route
from app.providers.cooldown import upstream_cooldowns

catalog_cli = OperatorGroup("catalog", help="Inspect the model catalog.")


@catalog_cli.command("list")
@JSON_OPTION
def list_catalog_command(as_json: bool) -> None:
    """List the served models, with prices and routes.

    Tokens are priced in USD per million, tool calls in USD per call; tiers multiply them.
    """
    if as_json:
        click.echo(json.dumps([_model_row(model) for model in current_catalog().list()], indent=2))
        return
    click.echo(
        "id\tprompt\tcompletion\tcached_read\timage\tcache_write\tcache_write_1h\t"
        "tool_calls\ttiers\tcontext\tcapabilities\troutes"
    )
    for model in current_catalog().list():
        p = model.pricing
        routes = ",".join(
            f"{r.adapter.upstream.name}:{r.target.upstream_model}{route_state(r)}"
            for r in model.routes
        )
        click.echo(
            f"{model.id}\t{p.prompt}\t{p.completion}\t{p.cached_read}\t{p.image}\t{p.cache_write}\t"
            f"{p.cache_write_1h}\t{price_list(p.tool_calls)}\t{price_list(p.tiers)}\t"
            f"{model.context_length}\t{','.join(sorted(model.capabilities)) or '-'}\t{routes}"
        )


PRICES = ("prompt", "completion", "cached_read", "image", "cache_write", "cache_write_1h")


def _model_row(model: Model) -> dict[str, object]:
    """Return a served model as --json shows it: prices as exact decimal strings."""
    p = model.pricing
    return {
        "id": model.id,
        "pricing": {name: str(getattr(p, name)) for name in PRICES},
        "tool_calls": {name: str(price) for name, price in sorted(p.tool_calls.items())},
        "tiers": {name: str(factor) for name, factor in sorted(p.tiers.items())},
        "context": model.context_length,
        "capabilities": sorted(model.capabilities),
        "routes": [
            {
                "upstream": r.adapter.upstream.name,
                "model": r.target.upstream_model,
                "state": route_state(r).strip(" ()") or None,
            }
            for r in model.routes
        ],
    }


def price_list(prices: Mapping[str, Decimal]) -> str:
    """Render a catalog's price table (tool calls, tiers) as ``name=price,...``, or ``-``."""
    return ",".join(f"{name}={price}" for name, price in sorted(prices.items())) or "-"


def route_state(route: Route) -> str:
    """Say when a route's upstream is cooling down or failing (state shared through Redis)."""
    state = upstream_cooldowns.state(route.adapter.upstream)
    if state.seconds_left > 0:
        return f" (cooling down, {math.ceil(state.seconds_left)}s left)"
    if state.failures:
        return f" ({state.failures} failures in a row)"
    return ""
