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


def presented_key(headers: Mapping[str, str]) -> str | None:
    """Return the API key a request presents: ``Authorization: Bearer`` or ``x-api-key``.

    Anthropic's SDKs send their key as ``x-api-key`` (an auth token as a bearer); the
    OpenAI SDKs as a bearer. A bearer wins when both come.
    """
    return bearer_token(headers.get("Authorization")) or headers.get("x-api-key") or None


def key_sent_as(headers: Mapping[str, str]) -> str | None:
    """Return the header the request's key came in (as presented_key reads it), or None."""
    if bearer_token(headers.get("Authorization")):
        return "Authorization: Bearer"
    if headers.get("x-api-key"):
        return "x-api-key"
    return NOT_BEARER if headers.get("Authorization") else NO_KEY


def request_caller() -> Caller | None:
    """Return the caller of the request's key, or None; looked up once per request.

    The rate limiter counts by the caller's key before the view runs, and the view's
    require_api_key then reuses the same lookup.
    """
    if "caller_lookup" not in g:
        g.caller_lookup = find_caller(presented_key(request.headers))
    return g.caller_lookup


def require_api_key(view: Callable[..., Any]) -> Callable[..., Any]:
    """Refuse the request with 401/403 unless it carries an active key.

    :raise InvalidKey: the key is missing, malformed or unknown.
    :raise KeyRevoked: the key was revoked.
    """

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        caller = request_caller()
        if caller is None:
            raise InvalidKey(key_sent_as(request.headers))
        if caller.state != ACTIVE:
            raise KeyRevoked()
        g.caller = caller
        return view(*args, **kwargs)

    return wrapped
