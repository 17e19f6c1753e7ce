"""Why a caller is refused."""

from __future__ import annotations

from app.errors import APIError

# How a request sent its key (auth.decorators.key_sent_as): in no header, in an
# Authorization header of another scheme than Bearer, or in the header named.
NO_KEY = None
NOT_BEARER = "Authorization"
# How the OpenAI doors ask for a key, as the contract says (section 5).
BEARER_ONLY = "'Authorization: Bearer <key>'"


class InvalidKey(APIError):
    """The key is missing, malformed or unknown (401).

    Its message says what the request sent and what the door accepts; each starts with
    "Incorrect API key provided", as the contract words invalid_api_key (section 7). A
    door accepting other headers rewords it (``worded``).
    """

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"

    def __init__(self, sent_as: str | None = "") -> None:
        self.sent_as = sent_as
        super().__init__(self.worded(BEARER_ONLY))

    def worded(self, accepted: str) -> str:
        """Say what was sent, and that a key is accepted as ``accepted``."""
        if self.sent_as is NO_KEY:
            return f"Incorrect API key provided: the request sent no key. Send it as {accepted}."
        if self.sent_as == NOT_BEARER:
            return (
                "Incorrect API key provided: the Authorization header does not say "
                f"'Bearer <key>'. Send the key as {accepted}."
            )
        where = f" as '{self.sent_as}'" if self.sent_as else ""
        return (
            f"Incorrect API key provided: the key sent{where} is not an active key of this "
            f"service (unknown, rotated or deleted). Send a valid key as {accepted}."
        )


class KeyRevoked(APIError):
    """The key exists but was revoked (403)."""

    status = 403
    type = "invalid_request_error"
    code = "api_key_revoked"
    default_message = "This API key has been revoked. Use an active key."
