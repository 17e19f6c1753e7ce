"""Generate a value that validates against a JSON Schema, deterministically.

The built-in model uses it for tool-call arguments and ``json_schema`` output. It covers
what function and response schemas use in practice: objects, arrays, strings with
formats and lengths, numbers with bounds and multiples, enums, consts, combinators and
local ``$ref``s (recursion is bounded). ``pattern`` and ``uniqueItems`` are not honoured.

Schemas are the caller's input, generated from on the worker that serves other requests:
besides the caps of each level, one instance has a budget of work (values generated,
references followed, keywords merged) and of characters (strings, keys, consts), so that
nested arrays or fan-out through ``$ref`` cannot multiply into millions of values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Caps on what a schema can ask for, so that a caller's schema cannot exhaust the worker.
MAX_ITEMS = 64
MAX_STRING_LENGTH = 4096
SHALLOW_SCHEMA_DEPTH = 8
MAX_SCHEMA_DEPTH = 16
# The budget of one instance, across all its levels.
MAX_INSTANCE_STEPS = 10_000
MAX_INSTANCE_CHARACTERS = 64 * 1024
# The integers an answer holds exactly wherever it is read: JSON encoders stop at 64 bits,
# JavaScript's numbers (so many clients' parsers) at 2**53, which floats also hold exactly.
MAX_INTEGER = 2**53
LOWER_BOUNDS = ("minimum", "exclusiveMinimum")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum")
FORMAT_EXAMPLES = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "12:00:00Z",
    "email": "user@example.com",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "123e4567-e89b-42d3-a456-426614174000",
}


class InstanceTooLarge(Exception):
    """The schema asks for more than one instance may hold; the message says which budget."""


@dataclass
class _SchemaWalk:
    """One instance generation: the root (for $ref), the words, the work and output spent."""

    root: Any
    words: Sequence[str]
    used: int = 0
    steps: int = 0
    characters: int = 0

    def spend(self, steps: int = 1, characters: int = 0) -> None:
        """Account for work and output; raise InstanceTooLarge past either budget."""
        self.steps += steps
        self.characters += characters
        if self.steps > MAX_INSTANCE_STEPS:
            raise InstanceTooLarge(
                f"its instance would take more than {MAX_INSTANCE_STEPS} values, "
                "references and merged keywords"
            )
        if self.characters > MAX_INSTANCE_CHARACTERS:
            raise InstanceTooLarge(
                f"its instance would be longer than {MAX_INSTANCE_CHARACTERS} characters"
            )

    def next_word(self) -> str:
        """Return the prompt's next word in turn, or "example" when it has none."""
        word = self.words[self.used % len(self.words)] if self.words else "example"
        self.used += 1
        self.spend(characters=len(word))
        return word

    def copy_of(self, value: Any) -> Any:
        """Return a const or enum value, paying for its length."""
        self.spend(characters=len(json.dumps(value)) if isinstance(value, dict | list) else 8)
        return value


def schema_instance(schema: Any, words: Sequence[str] = ()) -> Any:
    """Generate a value that validates against the JSON Schema ``schema``.

    Schemas are the caller's input, so any keyword may hold any JSON value: sizes are
    capped, and a schema too contradictory to instantiate gives None.

    :raise InstanceTooLarge: the whole instance would exceed the budget of one instance.
    """
    try:
        return _instance(schema, _SchemaWalk(schema, words), 0)
    except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError, RecursionError):
        return None


def _size(schema: dict[str, Any], key: str, cap: int) -> int | None:
    """Return a non-negative integer keyword, capped; None when absent or not an integer."""
    value = schema.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return min(max(value, 0), cap)


def _number(schema: dict[str, Any], key: str) -> float | None:
    """Return a finite numeric keyword, or None; an integer past 2**53 clamped to it."""
    value = schema.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and not -MAX_INTEGER <= value <= MAX_INTEGER:
        return _clamped(value, key)
    return value if math.isfinite(value) else None


def _clamped(value: float, key: str) -> int:
    """Clamp a bound past MAX_INTEGER to it, where every instance within it meets the bound.

    A minimum past the largest integer (a maximum past the smallest, a multiple of one
    that large) leaves no instance an answer can hold.
    """
    if key in UPPER_BOUNDS and value > 0:
        return MAX_INTEGER
    if key in LOWER_BOUNDS and value < 0:
        return -MAX_INTEGER
    raise InstanceTooLarge(f"its {key} is past the integers an answer can hold (2**53)")


def _instance(schema: Any, walk: _SchemaWalk, depth: int) -> Any:
    walk.spend()
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        return None
    if "const" in schema:
        return walk.copy_of(schema["const"])
    if schema.get("enum"):
        return walk.copy_of(schema["enum"][0])
    folded = _fold_combinator(schema, walk)
    if folded is not None:
        return _instance(folded, walk, depth + 1)
    return INSTANCE_BUILDERS.get(_schema_type(schema), _string_instance)(schema, walk, depth)


def _fold_combinator(schema: dict[str, Any], walk: _SchemaWalk) -> dict[str, Any] | None:
    """Merge one $ref, allOf, anyOf or oneOf into the schema's other keywords; None if none."""
    if "$ref" in schema:
        return _dereference(schema, walk)
    if schema.get("allOf"):
        merged = _without(schema, "allOf")
        for part in schema["allOf"]:
            merged = _merge_schemas(merged, _dereference(part, walk))
            walk.spend(len(merged) + len(merged.get("properties") or ()))
        return merged
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return _merge_schemas(_without(schema, key), _dereference(schema[key][0], walk))
    return None


def _dereference(schema: Any, walk: _SchemaWalk) -> dict[str, Any]:
    """Follow top-level $refs (a bounded number of them, against recursion)."""
    for _ in range(MAX_SCHEMA_DEPTH):
        if not isinstance(schema, dict) or "$ref" not in schema:
            break
        target = _resolve_pointer(walk.root, schema["$ref"])
        schema = _merge_schemas(target, _without(schema, "$ref"))
        walk.spend(len(schema))
    return schema if isinstance(schema, dict) else {}


def _resolve_pointer(root: Any, ref: Any) -> dict[str, Any]:
    """Resolve a local reference such as ``#/$defs/Name``; anything else resolves to {}."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return {}
    node = root
    for token in filter(None, ref[1:].split("/")):
        key = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and key.isascii() and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _without(schema: dict[str, Any], key: str) -> dict[str, Any]:
    return {name: value for name, value in schema.items() if name != key}


def _merge_schemas(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Combine two object schemas: properties and required lists join, other keys override."""
    merged = {**base, **extra}
    if isinstance(base.get("properties"), dict) and isinstance(extra.get("properties"), dict):
        merged["properties"] = {**base["properties"], **extra["properties"]}
    if isinstance(base.get("required"), list) and isinstance(extra.get("required"), list):
        merged["required"] = list(dict.fromkeys([*base["required"], *extra["required"]]))
    return merged


def _schema_type(schema: dict[str, Any]) -> str:
    """Return the type to generate: the first non-null one, else inferred, else string."""
    declared = schema.get("type")
    if isinstance(declared, list):
        return next((kind for kind in declared if kind != "null"), "null")
    if isinstance(declared, str):
        return declared
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    return "string"


def _object_instance(schema: dict[str, Any], walk: _SchemaWalk, depth: int) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    required = list(schema.get("required") or ())
    needed = set(required)
    # Deep down (recursive $refs) only required properties are filled, so generation ends.
    shallow = depth >= SHALLOW_SCHEMA_DEPTH
    value = {}
    for name, subschema in properties.items():
        walk.spend(characters=len(name))
        if not shallow or name in needed:
            value[name] = _instance(subschema, walk, depth + 1)
    for name in required:
        if name not in value:
            walk.spend(characters=len(str(name)))
            value[name] = walk.next_word()
    return value


def _array_instance(schema: dict[str, Any], walk: _SchemaWalk, depth: int) -> list[Any]:
    items = schema.get("items")
    prefix = schema.get("prefixItems") or (items if isinstance(items, list) else [])
    rest = items if isinstance(items, dict) else {}
    count = max(
        _size(schema, "minItems", MAX_ITEMS) or 0, 0 if depth >= SHALLOW_SCHEMA_DEPTH else 1
    )
    most = _size(schema, "maxItems", MAX_ITEMS)
    if most is not None:
        count = min(count, most)
    return [
        _instance(prefix[i] if i < len(prefix) else rest, walk, depth + 1) for i in range(count)
    ]


def _string_instance(schema: dict[str, Any], walk: _SchemaWalk, depth: int) -> str:
    form = schema.get("format")
    if isinstance(form, str) and form in FORMAT_EXAMPLES:
        return FORMAT_EXAMPLES[form]
    word = walk.next_word()
    shortest = _size(schema, "minLength", MAX_STRING_LENGTH) or 0
    longest = _size(schema, "maxLength", MAX_STRING_LENGTH)
    if len(word) < shortest:
        walk.spend(characters=shortest - len(word))
        word = (word * shortest)[:shortest]
    return word if longest is None else word[:longest]


def _bound(
    schema: dict[str, Any], key: str, exclusive_key: str, tighter: Callable[..., float]
) -> tuple[float | None, bool]:
    """Return one side's bound and whether it is exclusive (draft 4 flags or draft 6+ numbers)."""
    value, exclusive = _number(schema, key), schema.get(exclusive_key)
    if isinstance(exclusive, bool):
        return value, exclusive and value is not None
    exclusive = _number(schema, exclusive_key)
    if exclusive is None:
        return value, False
    if value is None or tighter(value, exclusive) == exclusive:
        return exclusive, True
    return value, False


def _integer_bound(value: float | None, key: str) -> float | None:
    """Return an integer instance's bound, clamped to MAX_INTEGER (see ``_clamped``)."""
    if value is None or -MAX_INTEGER <= value <= MAX_INTEGER:
        return value
    return _clamped(value, key)


def _multiple_between(step: float, low: Any, low_open: bool, high: Any, high_open: bool) -> float:
    """Return the multiple of ``step`` nearest the lower bound (or zero) inside the bounds."""
    if low is not None:
        k = math.ceil(low / step)
        if low_open and k * step <= low:
            k += 1
    elif high is not None and high <= 0:
        k = math.floor(high / step)
        if high_open and k * step >= high:
            k -= 1
    else:
        k = 0
    return k * step


def _number_between(low: Any, low_open: bool, high: Any, high_open: bool) -> float:
    """Return the lower bound, a point just above it, or zero, inside the bounds."""
    if low is not None:
        if not low_open:
            return low
        above = low + 1
        fits = high is None or above < high or (above == high and not high_open)
        return above if fits else (low + high) / 2
    if high is None or high > 0 or (high == 0 and not high_open):
        return 0
    return high - 1 if high_open else high


def _number_instance(
    schema: dict[str, Any], walk: _SchemaWalk, depth: int, integer: bool = False
) -> float:
    low, low_open = _bound(schema, "minimum", "exclusiveMinimum", max)
    high, high_open = _bound(schema, "maximum", "exclusiveMaximum", min)
    if integer:
        # Bounds JSON carried as floats (1e30): an integer answer stays within 2**53.
        low, high = _integer_bound(low, "minimum"), _integer_bound(high, "maximum")
    step = _number(schema, "multipleOf")
    step = step if step and step > 0 else (1 if integer else None)
    if step is None:
        return _number_between(low, low_open, high, high_open)
    try:
        value = _multiple_between(step, low, low_open, high, high_open)
        value = int(value) if integer and float(value).is_integer() else value
    except OverflowError:
        # A bound over a step past the largest float: no multiple can be written.
        value = math.inf
    if not (math.isfinite(value) and (isinstance(value, float) or abs(value) <= MAX_INTEGER)):
        raise InstanceTooLarge(
            "its bounds ask for an integer past those an answer can hold (2**53)"
        )
    return value


def _integer_instance(schema: dict[str, Any], walk: _SchemaWalk, depth: int) -> int:
    return _number_instance(schema, walk, depth, integer=True)


INSTANCE_BUILDERS: dict[str, Callable[[dict[str, Any], _SchemaWalk, int], Any]] = {
    "object": _object_instance,
    "array": _array_instance,
    "string": _string_instance,
    "integer": _integer_instance,
    "number": _number_instance,
    "boolean": lambda schema, walk, depth: True,
    "null": lambda schema, walk, depth: None,
}
