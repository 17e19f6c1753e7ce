"""JSON encoding for response bodies, stream events and JSON columns: fast, exact for money.

orjson is several times faster than the standard library on the hot path; money leaves
the service as a JSON number only here, converted from Decimal at the last moment.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import orjson
from flask.json.provider import JSONProvider


def _default(value: Any) -> Any:
    if isinstance(value, Decimal):
        # The shortest float repr round-trips to the same decimal digits for the
        # <= 15 significant digits a cost has, so the number written is exact.
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> bytes:
    """Encode ``value`` as compact UTF-8 JSON."""
    # orjson's bytes object keeps the whole buffer it encoded into, 4 KB at least however
    # short the JSON; a copy holds only the JSON. Thousands of open streams each keep
    # their upstream request body alive, so the copy is worth its few hundred nanoseconds.
    return bytes(memoryview(orjson.dumps(value, default=_default)))


def dumps_transient(value: Any) -> bytes:
    """Encode ``value`` like ``dumps``, for bytes that are copied at once and dropped.

    Without dumps' copy: what is built from it (a framed stream event) holds only the
    JSON, and orjson's buffer goes with the result.
    """
    return orjson.dumps(value, default=_default)


def dumps_text(value: Any) -> str:
    """Encode ``value`` like ``dumps``, as a str (decoded at once: no copy to keep)."""
    return dumps_transient(value).decode()


# Decodes JSON; raises ``orjson.JSONDecodeError`` (a ValueError) when malformed. orjson's
# own function: a wrapper would cost a call per relayed stream event.
loads = orjson.loads

# How every engine's JSON columns are written and read: a generation's record carries
# one, written on every billed request, where the standard library took 4 us.
JSON_COLUMN_CODEC = {"json_serializer": dumps_text, "json_deserializer": loads}


class OrjsonProvider(JSONProvider):
    """Make ``flask.jsonify`` and ``request.get_json`` use orjson."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        """Encode to str."""
        return dumps_text(obj)

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        """Decode from str or bytes."""
        return loads(s)
