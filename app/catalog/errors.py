"""What can go wrong when resolving a model or loading the catalog."""

from __future__ import annotations

from app.errors import APIError
from config.settings import ConfigurationError


class CatalogError(ConfigurationError):
    """The catalog file cannot be served; the message names the file, entry and problem."""


class UnknownModel(APIError):
    """The requested model id is not in the catalog (or is disabled)."""

    status = 400
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model_id: str) -> None:
        super().__init__(
            f"The model '{model_id}' does not exist or you do not have access to it.",
            param="model",
        )


class ModelNotPermitted(APIError):
    """The model is served, but the caller's key may not use it (403)."""

    status = 403
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model_id: str) -> None:
        super().__init__(
            f"The model '{model_id}' does not exist or you do not have access to it.",
            param="model",
        )


class CapabilityMissing(APIError):
    """The request uses a feature (images, tools, ...) the model does not have."""

    status = 400
    type = "invalid_request_error"
    code = "unsupported_parameter"
