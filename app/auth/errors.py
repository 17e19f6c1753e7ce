"""Why a caller is refused."""

from __future__ import annotations

from app.errors import APIError


class InvalidKey(APIError):
    """The bearer key is missing, malformed or unknown (401)."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"
    default_message = (
        "Incorrect API key provided. Send a valid key as 'Authorization: Bearer <key>'."
    )


class KeyRevoked(APIError):
    """The key exists but was revoked (403)."""

    status = 403
    type = "invalid_request_error"
    code = "api_key_revoked"
    default_message = "This API key has been revoked. Use an active key."
