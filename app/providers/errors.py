"""What can go wrong with an upstream, in terms the gateway maps to the contract's statuses.

Every ``UpstreamError`` lets the router move on to the model's next route; ``retryable``
says whether trying the same upstream again may help, and ``retry_after`` is the wait the
upstream asked for (its ``Retry-After``), if any. Messages never name the upstream, its
address or its key: they reach the caller.
"""

from __future__ import annotations

from app.errors import APIError


class UpstreamError(APIError):
    """The upstream could not produce an answer; worth trying again elsewhere."""

    status = 502
    type = "api_error"
    code = "upstream_error"
    retryable = True
    default_message = "The model's upstream failed to answer. Retry with backoff."
    # The upstream's own HTTP status, when it answered with an error one.
    upstream_status: int | None = None

    def __init__(
        self,
        message: str | None = None,
        *,
        retry_after: float | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.retry_after = retry_after


class UpstreamUnavailable(UpstreamError):
    """No upstream of the model could be reached, or all were overloaded."""

    status = 503
    code = "upstream_unavailable"
    default_message = "The model is temporarily unavailable. Retry with backoff."


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer within its timeout."""

    status = 504
    code = "upstream_timeout"
    default_message = "The model's upstream timed out. Retry with backoff."


class UpstreamMisconfigured(UpstreamError):
    """The upstream refused the gateway itself (its 401/403/404): the operator must fix it.

    Trying the same upstream again cannot help, another route may.
    """

    retryable = False


class UpstreamRejected(APIError):
    """The upstream refused the request itself (its 400): retrying will not help."""

    status = 400
    type = "invalid_request_error"
    code = "upstream_rejected"
    retryable = False
