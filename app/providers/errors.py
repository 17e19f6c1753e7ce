"""What can go wrong with an upstream, in terms the gateway maps to the contract's statuses."""

from __future__ import annotations

from app.errors import APIError


class UpstreamError(APIError):
    """The upstream could not produce an answer; worth trying again elsewhere."""

    status = 502
    type = "api_error"
    code = "upstream_error"
    retryable = True
    default_message = "The model's upstream failed to answer. Retry with backoff."


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


class UpstreamRejected(APIError):
    """The upstream refused the request itself (its 400): retrying will not help."""

    status = 400
    type = "invalid_request_error"
    code = "upstream_rejected"
    retryable = False
