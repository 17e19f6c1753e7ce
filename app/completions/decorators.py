"""Honour a caller's ``Idempotency-Key`` header on a view."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

from flask import Response, current_app, g, request

from app.completions.idempotency import (
    check_key,
    claim_key,
    mark_streamed,
    release_claim,
    store_answer,
)

REPLAYED_HEADER = "Idempotent-Replayed"


def honour_idempotency_key(view: Callable[..., Response]) -> Callable[..., Response]:
    """Run the view once per key and body; replay its answer to retries (see idempotency)."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Response:
        key = request.headers.get("Idempotency-Key")
        if key is None:
            return view(*args, **kwargs)
        body_digest = hashlib.sha256(request.get_data(cache=True)).hexdigest()
        claim = claim_key(
            account_id=g.caller.account_id,
            key=check_key(key),
            body_digest=body_digest,
            claim_ttl_seconds=current_app.config["HOLD_TTL_SECONDS"],
        )
        if claim.replay is not None:
            return Response(
                claim.replay, mimetype="application/json", headers={REPLAYED_HEADER: "true"}
            )
        try:
            response = view(*args, **kwargs)
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

    return wrapped
