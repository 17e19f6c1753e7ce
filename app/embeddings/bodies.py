"""OpenAI's wire format of an embeddings answer: the vectors, as floats or base64, and usage.

Vectors go out as float32, as OpenAI's do: ``base64`` is their little-endian bytes, and
``float`` the same float32 values as JSON numbers, so both formats decode to equal vectors.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from app.providers.base import Embeddings
from app.providers.vectors import Vector

WRITERS: dict[str, Callable[[Vector], Any]] = {
    "float": Vector.as_floats,
    "base64": Vector.as_base64,
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
