"""Generated instances validate against their JSON Schemas, predictably."""

import uuid
from datetime import date, datetime
from urllib.parse import urlparse

import jsonschema
import pytest

from app.encoding import dumps, loads
from app.providers import schema_instances
from app.providers.schema_instances import schema_instance
from tests.unit.providers.test_builtin import ORDER_SCHEMA, SEARCH

RECURSIVE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["value"],
        }
    },
    "$ref": "#/$defs/node",
}
SCHEMAS = {
    "string": {"type": "string"},
    "string-lengths": {"type": "string", "minLength": 12, "maxLength": 14},
    "string-short": {"type": "string", "maxLength": 2},
    "enum": {"type": "string", "enum": ["red", "green"]},
    "const": {"const": 42},
    "date-time": {"type": "string", "format": "date-time"},
    "date": {"type": "string", "format": "date"},
    "email": {"type": "string", "format": "email"},
    "uri": {"type": "string", "format": "uri"},
    "uuid": {"type": "string", "format": "uuid"},
    "ipv4": {"type": "string", "format": "ipv4"},
    "integer-range": {"type": "integer", "minimum": 5, "maximum": 9},
    "integer-exclusive": {"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 7},
    "integer-multiple": {"type": "integer", "minimum": 7, "multipleOf": 5},
    "integer-negative": {"type": "integer", "exclusiveMaximum": 0},
    "number-open-low": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 1},
    "number-max": {"type": "number", "maximum": -3.5},
    "number-multiple": {"type": "number", "exclusiveMaximum": -2, "multipleOf": 0.5},
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "nullable": {"type": ["null", "integer"], "minimum": 3},
    "array": {"type": "array", "items": {"type": "integer", "minimum": 2}, "minItems": 3},
    "array-empty": {"type": "array", "items": {"type": "string"}, "maxItems": 0},
    "tuple": {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "integer"}],
        "minItems": 2,
    },
    "nested": ORDER_SCHEMA,
    "tool-parameters": SEARCH["function"]["parameters"],
    "definitions": {
        "definitions": {"pair": {"type": "array", "items": {"type": "boolean"}, "minItems": 2}},
        "type": "object",
        "properties": {"pair": {"$ref": "#/definitions/pair"}},
        "required": ["pair"],
    },
    "recursive": RECURSIVE,
    "any-of": {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]},
    "one-of": {"oneOf": [{"type": "integer", "minimum": 10}, {"type": "string"}]},
    "all-of": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"type": "integer", "minimum": 3}}, "required": ["b"]},
        ]
    },
    "untyped": {},
    "required-only": {"type": "object", "required": ["x"]},
    "untyped-object": {"properties": {"n": {"type": "number"}}, "required": ["n"]},
}


@pytest.mark.parametrize("schema", SCHEMAS.values(), ids=SCHEMAS.keys())
def test_schema_instances_validate(schema):
    instance = schema_instance(schema, ["Paris", "Lyon"])
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    validator.validate(instance)


def test_formats_the_installed_checker_skips_are_still_valid():
    assert datetime.fromisoformat(schema_instance(SCHEMAS["date-time"]))
    assert date.fromisoformat(schema_instance(SCHEMAS["date"]))
    assert urlparse(schema_instance(SCHEMAS["uri"])).scheme == "https"
    assert uuid.UUID(schema_instance(SCHEMAS["uuid"])).version == 4


@pytest.mark.parametrize(
    "name, expected",
    [
        ("enum", "red"),
        ("const", 42),
        ("integer-range", 5),
        ("integer-exclusive", 6),
        ("integer-multiple", 10),
        ("integer-negative", -1),
        ("number-open-low", 0.75),
        ("number-max", -3.5),
        ("number-multiple", -2.5),
        ("nullable", 3),
        ("array", [2, 2, 2]),
        ("array-empty", []),
        ("tuple", ["Paris", 0]),
        ("string-short", "Pa"),
        ("string-lengths", "ParisParisPa"),
        ("one-of", 10),
        ("all-of", {"a": "Paris", "b": 3}),
    ],
)
def test_schema_instances_are_predictable(name, expected):
    assert schema_instance(SCHEMAS[name], ["Paris", "Lyon"]) == expected


def test_strings_without_prompt_words_are_example():
    assert schema_instance({"type": "string"}) == "example"


def test_draft4_boolean_exclusive_bounds_are_understood():
    schema = {"type": "integer", "minimum": 3, "exclusiveMinimum": True}
    assert schema_instance(schema) == 4
    jsonschema.Draft4Validator(schema).validate(4)


def test_a_recursive_schema_ends():
    depth, node = 0, schema_instance(RECURSIVE)
    while node.get("children"):
        depth, node = depth + 1, node["children"][0]
    assert 0 < depth < schema_instances.MAX_SCHEMA_DEPTH


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "minItems": 10**9},
        {"type": "string", "minLength": 10**9},
        {"type": "array", "minItems": "many"},
        {"type": "string", "minLength": 2.5, "maxLength": None},
        {"type": "integer", "multipleOf": 0},
        {"type": "number", "multipleOf": -3, "minimum": "low"},
        {"type": "number", "minimum": 1e308, "exclusiveMinimum": True},
        {"type": "object", "properties": ["not", "a", "map"]},
        {"type": "object", "required": [["unhashable"]]},
        {"type": "string", "format": {"not": "hashable"}},
        {"enum": {"a": 1}},
        {"$ref": "#/$defs/missing"},
        {"$ref": 42},
    ],
)
def test_hostile_schemas_give_a_bounded_value_and_never_raise(schema):
    value = schema_instance(schema, ["word"])
    assert len(repr(value)) < 300_000


def arrays(levels: int, items: int = 64) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "minItems": items, "items": schema}
    return schema


@pytest.mark.parametrize(
    "schema",
    [
        arrays(3),
        {
            "$defs": {"a": arrays(2)},
            "type": "array",
            "minItems": 64,
            "items": {"$ref": "#/$defs/a"},
        },
        {"type": "array", "minItems": 64, "items": {"type": "string", "minLength": 4096}},
        {"type": "array", "minItems": 64, "items": {"const": ["x" * 2000]}},
        {"type": "object", "required": [f"name{i}" for i in range(20_000)]},
        {"allOf": [{"properties": {f"p{i}": {} for i in range(200)}}] * 200},
    ],
    ids=["nested-arrays", "ref-fan-out", "long-strings", "big-consts", "required", "allOf"],
)
def test_an_instance_past_the_whole_budget_is_refused(schema):
    with pytest.raises(schema_instances.InstanceTooLarge):
        schema_instance(schema, ["word"])


def test_long_prompt_words_count_against_the_character_budget():
    schema = {"type": "array", "minItems": 64, "items": {"type": "string"}}
    assert len(schema_instance(schema, ["word"])) == 64
    with pytest.raises(schema_instances.InstanceTooLarge):
        schema_instance(schema, ["w" * 2000])


def test_an_instance_within_the_budget_validates():
    schema = arrays(2)
    value = schema_instance(schema)
    assert len(value) == 64 and all(len(row) == 64 for row in value)
    jsonschema.validate(value, schema)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "integer", "maximum": 10**30}, 0),
        ({"type": "integer", "minimum": -(10**30), "maximum": -5}, -(2**53)),
        ({"type": "integer", "minimum": 3, "exclusiveMaximum": 10**400}, 3),
        ({"type": "number", "minimum": -(10**30)}, -(2**53)),
    ],
)
def test_a_bound_past_2_to_the_53_is_clamped_where_the_instance_stays_valid(schema, expected):
    value = schema_instance(schema)
    assert value == expected
    jsonschema.validate(loads(dumps(value)), schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 10**30},
        {"type": "integer", "exclusiveMinimum": 10**400},
        {"type": "integer", "minimum": 1e30},
        {"type": "integer", "maximum": -1e30},
        {"type": "integer", "minimum": 1e30, "multipleOf": 0.5},
        {"type": "number", "minimum": 1e308, "multipleOf": 1e-10},
        {"type": "integer", "multipleOf": 10**30, "minimum": 1},
        {"type": "integer", "minimum": 2**60 - 1, "maximum": 2**61},
    ],
)
def test_an_integer_no_answer_can_hold_is_refused(schema):
    with pytest.raises(schema_instances.InstanceTooLarge):
        schema_instance(schema)
