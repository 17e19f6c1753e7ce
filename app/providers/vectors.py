"""Embedding vectors: float32, held in the form they came in until a caller's format is known.

OpenAI's API sends a vector as JSON numbers or as base64 of its little-endian float32
bytes, and so do the servers that copy it. A vector that came as base64 and goes out as
base64 (what the OpenAI SDKs ask for by default) is passed on as it came, as a chat
answer's text is: decoding it, or even reading each of its characters in Python's C,
costs more than the rest of the request. Its shape is checked (ASCII, whole groups of
four, whole float32 numbers); it is decoded, strictly, only for a caller who asks for
numbers, and one that does not decode is the upstream's failure (UnreadableVector).
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from dataclasses import dataclass

FLOAT32_BYTES = 4


class UnreadableVector(ValueError):
    """A vector sent as base64 that does not decode: the upstream answered something else."""


@dataclass(frozen=True)
class Vector:
    """One float32 vector: its base64 (``packed``) as it came, or its numbers (``values``)."""

    packed: str | None = None
    values: array | None = None

    def as_base64(self) -> str:
        """Return base64 of the vector's little-endian float32 bytes."""
        if self.packed is not None:
            return self.packed
        values = self.values
        if sys.byteorder == "big":
            values = array("f", values)
            values.byteswap()
        return base64.b64encode(values.tobytes()).decode("ascii")

    def as_floats(self) -> list[float]:
        """Return the vector's float32 numbers, as Python floats."""
        if self.values is not None:
            return self.values.tolist()
        try:
            values = array("f", binascii.a2b_base64(self.packed, strict_mode=True))
        except ValueError:  # binascii.Error is one
            raise UnreadableVector() from None
        if sys.byteorder == "big":
            values.byteswap()
        return values.tolist()


def from_numbers(numbers: object) -> Vector | None:
    """Return the vector of a JSON array of numbers, rounded to float32; None if it is not one."""
    if not isinstance(numbers, list) or not numbers:
        return None
    try:
        # In C: a number per dimension is too many to check one by one in Python.
        return Vector(values=array("f", numbers))
    except TypeError:
        return None


def from_base64(text: object) -> Vector | None:
    """Return the vector of ``text``, base64 of float32 numbers; None if it has not that shape.

    The shape, checked without reading every character (see the module): ASCII (which
    Python knows of a string without reading it), whole groups of four, at most two
    ``=`` at the end, and a whole number of 4-byte floats once decoded.
    """
    if not isinstance(text, str) or not text or not text.isascii() or len(text) % 4:
        return None
    padding = len(text) - len(text.rstrip("="))
    size = len(text) // 4 * 3 - padding
    if padding > 2 or size % FLOAT32_BYTES:
        return None
    return Vector(packed=text)
