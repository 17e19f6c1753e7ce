"""Honour a caller's ``Idempotency-Key`` header on a view."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

from flask import Response, current_app, g, request

from app.credits.errors import HoldVoided
from app.generations.idempotency import (
    IdempotencyKeyInUse,
    check_key,
    claim_key,
    mark_streamed,
    release_claim,
    store_answer,
)

REPLAYED_HEADER = "Idempotent-Replayed"


def claimed_generation_id() -> str | None:
    """Return the generation id the request's Idempotency-Key claimed, if it has one."""
    # The request's globals themselves: g.get would look the app's context up twice.
    return g._get_current_object().get("claimed_generation_id")


def honour_idempotency_key(
    new_generation_id: Callable[[], str],
) -> Callable[[Callable[..., Response]], Callable[..., Response]]:
    """Run the view once per key and body; replay its answer to retries (see idempotency).

    The claim names the generation that runs the request, made by ``new_generation_id``;
    the view starts its generation under ``claimed_generation_id()``.
    """

    def decorate(view: Callable[..., Response]) -> Callable[..., Response]:
        @functools.wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Response:
            # The request itself: an attribute read through Flask's proxy costs several
            # times as much, and every request of the view asks.
            key = request._get_current_object().headers.get("Idempotency-Key")
            if key is None:
                return view(*args, **kwargs)
            return _run_once(view, key, new_generation_id, args, kwargs)

        return wrapped

    return decorate


def _run_once(
    view: Callable[..., Response],
    key: str,
    new_generation_id: Callable[[], str],
    args: tuple,
    kwargs: dict[str, Any],
) -> Response:
    body_digest = hashlib.sha256(request.get_data(cache=True)).hexdigest()
    claim = claim_key(
        account_id=g.caller.account_id,
        key=check_key(key),
        body_digest=body_digest,
        claim_ttl_seconds=current_app.config["HOLD_TTL_SECONDS"],
        new_generation_id=new_generation_id,
    )
    if claim.replay is not None:
        return Response(
            claim.replay, mimetype="application/json", headers={REPLAYED_HEADER: "true"}
        )
    g.claimed_generation_id = claim.generation_id
    try:
        response = view(*args, **kwargs)
    except HoldVoided:
        # A retry took the key over while this request stalled: the retry runs it.
        raise IdempotencyKeyInUse(
            "A retry with this Idempotency-Key took this request over: it runs there."
        ) from None
    except BaseException:
        release_claim(claim)
        raise
    if response.is_streamed:
        mark_streamed(claim)
    elif response.status_code == 200:
        store_answer(claim, response.get_data())
    else:
        release_claim(claim)
    return response
