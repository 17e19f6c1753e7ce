"""GET /metrics: Prometheus text, for the operator's scraper only."""

from __future__ import annotations

import hmac
import logging

from flask import Blueprint, Response, current_app, request
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import NotFound

from app.auth.decorators import bearer_token
from app.catalog.registry import Catalog, current_catalog
from app.credits.balances import open_holds_summary
from app.extensions import db
from app.observability.metrics import gauge, render_metrics
from app.providers.base import UpstreamConfig
from app.providers.cooldown import UpstreamCooldowns, upstream_cooldowns

log = logging.getLogger(__name__)
bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def read_metrics() -> Response:
    """Answer the metrics to a bearer of METRICS_TOKEN; to anyone else, not found."""
    expected = current_app.config.get("METRICS_TOKEN")
    presented = bearer_token(request.headers.get("Authorization")) or ""
    if not expected or not hmac.compare_digest(presented.encode(), expected.encode()):
        # 404, not 401: the endpoint does not advertise itself to those who may not scrape.
        raise NotFound()
    scraped = [*hold_families(), *upstream_state_families(current_catalog(), upstream_cooldowns)]
    return Response(render_metrics(scraped), mimetype=CONTENT_TYPE_LATEST.split(";")[0])


def hold_families() -> list[Metric]:
    """Read the open holds; when the database fails, the scrape goes on without them."""
    try:
        holds = open_holds_summary()
    except SQLAlchemyError:
        db.session.rollback()
        log.exception("metrics: could not read the open holds")
        return []
    return [
        gauge("gateway_holds_open", "Credit holds of requests in flight.", holds.count),
        gauge("gateway_holds_open_usd", "USD held for requests in flight.", holds.amount),
    ]


def upstream_state_families(catalog: Catalog, cooldowns: UpstreamCooldowns) -> list[Metric]:
    """Read every upstream's cooldown state: failures in a row, seconds of cooldown left."""
    failures = GaugeMetricFamily(
        "gateway_upstream_consecutive_failures",
        "Calls to the upstream that failed in a row.",
        labels=["upstream"],
    )
    cooling = GaugeMetricFamily(
        "gateway_upstream_cooldown_seconds",
        "Seconds the upstream's cooldown has left (0: it is served).",
        labels=["upstream"],
    )
    for upstream in catalog_upstreams(catalog):
        state = cooldowns.state(upstream)
        failures.add_metric([upstream.name], state.failures)
        cooling.add_metric([upstream.name], state.seconds_left)
    return [failures, cooling]


def catalog_upstreams(catalog: Catalog) -> list[UpstreamConfig]:
    """Return the upstreams the catalog's routes use, each once, in catalog order."""
    seen: dict[str, UpstreamConfig] = {}
    for model in catalog.list():
        for route in model.routes:
            seen.setdefault(route.adapter.upstream.name, route.adapter.upstream)
    return list(seen.values())
