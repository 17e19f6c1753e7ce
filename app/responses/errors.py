"""What can go wrong with stored responses and the conversations they continue."""

from __future__ import annotations

from app.errors import APIError


class ResponseNotFound(APIError):
    """No stored response of the caller's account has the id (404), whatever the reason.

    Another account's response, one stored without ``store``, deleted or past its time
    all read the same, so that ids of other accounts cannot be probed.
    """

    status = 404
    type = "invalid_request_error"
    code = "response_not_found"

    def __init__(
        self, response_id: str, *, param: str | None = None, message: str | None = None
    ) -> None:
        super().__init__(
            message or f"No stored response with id '{response_id[:64]}'.", param=param
        )


class PreviousResponseNotFound(ResponseNotFound):
    """``previous_response_id`` names no stored response of the caller's (404)."""

    code = "previous_response_not_found"


class ItemNotFound(APIError):
    """An ``item_reference`` names no item of the caller's stored responses (404)."""

    status = 404
    type = "invalid_request_error"
    code = "item_not_found"


class ConversationTooLong(APIError):
    """The chain of responses a request continues is past the gateway's bounds (400)."""

    status = 400
    type = "invalid_request_error"
    code = "conversation_too_long"
