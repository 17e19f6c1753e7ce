"""What can go wrong when resolving a model or loading the catalog."""

from __future__ import annotations

from app.errors import APIError


class CatalogError(Exception):
    """The catalog file cannot be served; the message names the file, entry and problem."""


class NoSuchModel(APIError):
    """A model the caller may not have: one message whatever the reason, as the contract says.

    Whether the model is not served or only not to this key, the answer reads the same, so
    that a key's limits do not reveal which models exist.
    """

    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model_id: str) -> None:
        super().__init__(
            f"The model '{model_id}' does not exist or you do not have access to it.",
            param="model",
        )


class UnknownModel(NoSuchModel):
    """The requested model id is not in the catalog (or is disabled)."""

    status = 400


class ModelNotPermitted(NoSuchModel):
    """The model is served, but the caller's key may not use it (403)."""

    status = 403


class WrongModelType(APIError):
    """The model is of another type than the door serves: chat, or embedding (400)."""

    status = 400
    type = "invalid_request_error"
    code = "wrong_model_type"

    def __init__(self, model_id: str, model_type: str) -> None:
        if model_type == "embedding":
            message = (
                f"The model '{model_id}' is an embedding model: send it to /v1/embeddings "
                "(or Gemini's :embedContent and :batchEmbedContents)."
            )
        else:
            message = f"The model '{model_id}' is a {model_type} model, not an embedding model."
        super().__init__(message, param="model")


class CapabilityMissing(APIError):
    """The request uses a feature (images, tools, ...) the model does not have."""

    status = 400
    type = "invalid_request_error"
    code = "unsupported_parameter"


class ModelNotFound(NoSuchModel):
    """GET /v1/models/{id} names a model that is not served, or not to this caller (404)."""

    status = 404
