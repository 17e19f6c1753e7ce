"""The body of POST /v1/embeddings, as OpenAI's API takes it, validated into an EmbeddingRequest.

``input`` is a string, an array of strings, an array of token ids, or an array of such
arrays; at most MAX_INPUTS inputs, none empty. ``encoding_format`` is ``float`` (the
default) or ``base64``; ``dimensions`` a positive integer, for models that take it;
``user`` a string. Other fields are ignored, as OpenAI's other doors here ignore them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.errors import InvalidRequest
from app.generations.refusals import MAX_EMBEDDING_INPUTS as MAX_INPUTS
from app.providers.base import EmbeddingRequest

# Token ids are non-negative and fit in 32 bits: no tokenizer has a larger vocabulary.
MAX_TOKEN_ID = 2**31 - 1
ENCODING_FORMATS = ("float", "base64")


@dataclass(frozen=True)
class ParsedEmbeddingRequest:
    """A validated request: what to embed, and how the caller wants the vectors written."""

    request: EmbeddingRequest
    encoding_format: str


def parse_embedding_request(body: Any) -> ParsedEmbeddingRequest:
    """Validate a decoded JSON body; raise InvalidRequest naming the offending param."""
    if type(body) is not dict:
        raise InvalidRequest("The request body must be a JSON object.")
    model = body.get("model")
    if type(model) is not str:
        raise InvalidRequest(
            "model is required." if model is None else "model must be a string.", param="model"
        )
    encoding_format = body.get("encoding_format")
    if encoding_format is None:
        encoding_format = "float"
    elif encoding_format not in ENCODING_FORMATS:
        raise InvalidRequest(
            "encoding_format must be one of float, base64.", param="encoding_format"
        )
    request = EmbeddingRequest(
        model=model,
        inputs=parse_inputs(body.get("input")),
        dimensions=_optional_positive_int(body.get("dimensions"), "dimensions"),
        user=_optional_string(body.get("user"), "user"),
    )
    return ParsedEmbeddingRequest(request, encoding_format)


def parse_inputs(raw: Any) -> list[str] | list[list[int]]:
    """Return ``input`` as a list of inputs: texts, or arrays of token ids."""
    if type(raw) is str:
        inputs: list[Any] = [raw]
    elif type(raw) is list and raw and all(type(item) is int for item in raw):
        inputs = [raw]
    elif type(raw) is list:
        inputs = raw
    else:
        raise InvalidRequest("input is required." if raw is None else _INPUT_SHAPE, param="input")
    if not inputs:
        raise InvalidRequest("input must not be empty.", param="input")
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequest(
            f"input must have at most {MAX_INPUTS} items; it has {len(inputs)}.", param="input"
        )
    kind = type(inputs[0])
    for index, item in enumerate(inputs):
        _check_input(item, kind, index)
    return inputs


_INPUT_SHAPE = (
    "input must be a string, an array of strings, an array of token ids, "
    "or an array of arrays of token ids."
)


def _check_input(item: Any, kind: type, index: int) -> None:
    param = f"input[{index}]"
    if type(item) is not kind or kind not in (str, list):
        raise InvalidRequest(_INPUT_SHAPE, param=param)
    if not item:
        raise InvalidRequest(f"{param} must not be empty.", param=param)
    if kind is list and not all(
        type(token) is int and 0 <= token <= MAX_TOKEN_ID for token in item
    ):
        raise InvalidRequest(
            f"{param} must hold token ids: integers from 0 to {MAX_TOKEN_ID}.", param=param
        )


def _optional_positive_int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise InvalidRequest(f"{name} must be a positive integer.", param=name)
    return value


def _optional_string(value: Any, name: str) -> str | None:
    if value is not None and type(value) is not str:
        raise InvalidRequest(f"{name} must be a string.", param=name)
    return value
