"""Seeing inside the running service: request ids, logs, metrics and the proxies in front."""

from __future__ import annotations

from flask import Flask, g, request

from app.observability.logs import configure_logging
from app.observability.middleware import RequestObserver, TrustedProxies
from app.observability.trace import current_trace


def init_observability(app: Flask) -> None:
    """Log as LOG_FORMAT says, trace every request, and trust the configured proxies."""
    configure_logging(app.config["LOG_FORMAT"])
    app.wsgi_app = RequestObserver(  # type: ignore[method-assign]
        TrustedProxies(
            app.wsgi_app, hops=app.config["PROXY_HOPS"], allowed=app.config["FORWARDED_ALLOW_IPS"]
        )
    )
    app.before_request(note_route)
    app.after_request(note_caller)


def note_route() -> None:
    """Name the request's route (its URL rule) for the metrics; unknown paths are one label."""
    rule = request.url_rule
    if rule is not None:
        current_trace().route = rule.rule


def note_caller(response):  # noqa: ANN001, ANN201
    """Note who called, once the key has been checked."""
    # The request's globals themselves: g.get would look the app's context up twice.
    caller = g._get_current_object().get("caller")
    if caller is not None:
        trace = current_trace()
        trace.account_id, trace.key_id = caller.account_id, caller.key_id
    return response
