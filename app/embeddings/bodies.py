"""OpenAI's wire format of an embeddings answer: the vectors, as floats or base64, and usage.

Vectors go out as float32, as OpenAI's do: ``base64`` is their little-endian bytes, and
``float`` the same float32 values as JSON numbers, so both formats decode to equal vectors.
"""

from __future__ import annotations

import base64
import sys
from array import array
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from app.providers.base import Embeddings


def float_vector(vector: list[float]) -> list[float]:
    """Return ``vector`` rounded to float32, as JSON numbers."""
    return array("f", vector).tolist()


def base64_vector(vector: list[float]) -> str:
    """Return ``vector`` as base64 of its little-endian float32 bytes."""
    packed = array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


WRITERS: dict[str, Callable[[list[float]], Any]] = {
    "float": float_vector,
    "base64": base64_vector,
}


def embeddings_body(
    embeddings: Embeddings, *, model_id: str, encoding_format: str, cost: Decimal
) -> dict[str, Any]:
    """Build OpenAI's CreateEmbeddingResponse, its usage carrying the charge."""
    write = WRITERS[encoding_format]
    tokens = embeddings.usage.prompt_tokens
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": write(vector)}
            for index, vector in enumerate(embeddings.vectors)
        ],
        "model": model_id,
        "usage": {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "cost": {"total_cost": cost},
        },
    }
