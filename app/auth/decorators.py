"""Require a valid API key on a view, and put its caller in ``g.caller``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from flask import g, request

from app.auth.errors import NO_KEY, NOT_BEARER, InvalidKey, KeyRevoked
from app.auth.keys import Caller, find_caller
from app.auth.models import ACTIVE


def bearer_token(header: str | None) -> str | None:
    """Return the token of an ``Authorization: Bearer <token>`` header, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


# Where a key may come besides a bearer, in order: Anthropic's SDKs send ``x-api-key``,
# Google's ``x-goog-api-key`` (or the ``key`` query parameter, which the gateway never logs:
# its access lines name the path alone).
KEY_HEADERS = ("x-api-key", "x-goog-api-key")
KEY_PARAMETER = "key"


def presented_key(headers: Mapping[str, str], args: Mapping[str, str] | None = None) -> str | None:
    """Return the API key a request presents: a bearer, a key header, or ``?key=``.

    The OpenAI SDKs send a bearer; Anthropic's ``x-api-key`` (an auth token as a bearer);
    Google's ``x-goog-api-key`` or ``?key=``. A bearer wins when several come.
    """
    if token := bearer_token(headers.get("Authorization")):
        return token
    for name in KEY_HEADERS:
        if value := headers.get(name):
            return value
    return (args or {}).get(KEY_PARAMETER) or None


def key_sent_as(headers: Mapping[str, str], args: Mapping[str, str] | None = None) -> str | None:
    """Return where the request's key came (as presented_key reads it), or None."""
    if bearer_token(headers.get("Authorization")):
        return "Authorization: Bearer"
    for name in KEY_HEADERS:
        if headers.get(name):
            return name
    if (args or {}).get(KEY_PARAMETER):
        return "?key="
    return NOT_BEARER if headers.get("Authorization") else NO_KEY


def request_caller() -> Caller | None:
    """Return the caller of the request's key, or None; looked up once per request.

    The rate limiter counts by the caller's key before the view runs, and the view's
    require_api_key then reuses the same lookup.
    """
    # g and request are read once each: every use of one of Flask's proxies looks the
    # request's context up again, which costs more than the rest of this function.
    request_globals = g._get_current_object()
    if "caller_lookup" not in request_globals:
        served = request._get_current_object()
        request_globals.caller_lookup = find_caller(presented_key(served.headers, served.args))
    return request_globals.caller_lookup


def require_api_key(view: Callable[..., Any]) -> Callable[..., Any]:
    """Refuse the request with 401/403 unless it carries an active key.

    :raise InvalidKey: the key is missing, malformed or unknown.
    :raise KeyRevoked: the key was revoked.
    """

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        caller = request_caller()
        if caller is None:
            raise InvalidKey(key_sent_as(request.headers, request.args))
        if caller.state != ACTIVE:
            raise KeyRevoked()
        # Set on g itself: through Flask's proxy, the assignment costs three times as much.
        g._get_current_object().caller = caller
        return view(*args, **kwargs)

    return wrapped
