"""The built-in ``dev-embed`` model's vectors: hashed token features, not meaning.

Each token of an input (the built-in tokenizer's words and punctuation, lower-cased; or
each token id) adds +1 or -1 at one position of the vector, both chosen by a hash of the
token; the sum is scaled to length 1. The same input always gets the same vector, inputs
sharing words point the same way, and nothing else about language is known: "car" and
"automobile" are as far apart as any two words. ``docs/builtin-model.md`` says so.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

# The vector size dev-embed answers with when the request asks for none.
NATIVE_DIMENSIONS = 256


def hashed_vector(tokens: Iterable[str], dimensions: int = NATIVE_DIMENSIONS) -> list[float]:
    """Return the unit vector of ``tokens``' hashed features, of ``dimensions`` positions.

    A shorter vector (``dimensions``) hashes the same features into fewer positions: it
    is no prefix of the full one, as a real model's shortened embedding would be.
    """
    vector = [0.0] * dimensions
    for token in tokens:
        digest = hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=4).digest()
        position = int.from_bytes(digest[:3], "little") % dimensions
        vector[position] += 1.0 if digest[3] & 1 else -1.0
    length = math.sqrt(sum(value * value for value in vector))
    # Features that cancelled out leave a zero vector: there is no direction to scale.
    return [value / length for value in vector] if length else vector
