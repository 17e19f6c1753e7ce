"""Marshmallow fields and schemas with JSON's strict types, for every door's request body.

``null`` means absent; ``1`` is no boolean, ``"1"`` no integer, ``1.5`` no integer. Unknown
keys are dropped, and every message completes a sentence that starts with the field's
path, which ``first_error`` finds: ``messages[1].content[0].image_url.url must be a string.``
"""

from __future__ import annotations

import math
from typing import Any

from marshmallow import EXCLUDE, Schema, ValidationError, fields, missing

from app.errors import InvalidRequest

# Every message below completes a sentence that starts with the field's path.
ONE_OF = "must be one of {choices}."
BETWEEN = "must be between {min} and {max}."
NOT_EMPTY = "must not be empty."


class OptionalField(fields.Field):
    """Base of every field: ``null`` counts as absent, and messages read as predicates."""

    default_error_messages = {
        "required": "is required.",
        "validator_failed": "is invalid.",
    }

    def deserialize(
        self, value: Any, attr: str | None = None, data: Any = None, **kwargs: Any
    ) -> Any:
        """Treat ``null`` as a missing value, then deserialize, validate and post-process."""
        # Field.deserialize, minus the steps no field here uses (pre_load, allow_none):
        # this runs for every declared field of every object, present or not.
        if value is None or value is missing:
            if self.required:
                raise self.make_error("required")
            return self.load_default
        output = self._deserialize(value, attr, data, **kwargs)
        if self.validators:
            self._validate(output)
        for process in self.post_load:
            output = process(output)
        return output


class StringField(OptionalField):
    """A JSON string."""

    default_error_messages = {"invalid": "must be a string."}

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is not str:
            raise self.make_error("invalid")
        return value


class IntegerField(OptionalField):
    """A JSON integer: not a float, not a boolean, not a numeric string."""

    default_error_messages = {"invalid": "must be an integer."}

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is not int:
            raise self.make_error("invalid")
        return value


class NumberField(OptionalField):
    """A finite JSON number, integer or float (not a boolean, not a numeric string)."""

    default_error_messages = {"invalid": "must be a number."}

    def _deserialize(self, value, attr, data, **kwargs):
        kind = type(value)
        if kind is not int and (kind is not float or not math.isfinite(value)):
            raise self.make_error("invalid")
        return value


class BooleanField(OptionalField):
    """A JSON boolean: ``true`` or ``false`` only."""

    default_error_messages = {"invalid": "must be a boolean."}

    def _deserialize(self, value, attr, data, **kwargs):
        if value is not True and value is not False:
            raise self.make_error("invalid")
        return value


class ObjectField(OptionalField):
    """A free-form JSON object, passed on as it came."""

    default_error_messages = {"invalid": "must be an object."}

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is not dict:
            raise self.make_error("invalid")
        return value


class NestedField(OptionalField, fields.Nested):
    """An object loaded by a schema (which reports a non-object itself)."""


class WholeObjectField(NestedField):
    """An object checked by a schema but passed on whole, unknown keys included."""

    def _deserialize(self, value, attr, data, **kwargs):
        super()._deserialize(value, attr, data, **kwargs)
        return value


class ListOf(OptionalField, fields.List):
    """A JSON array of objects, each loaded by ``schema``."""

    default_error_messages = {"invalid": "must be an array."}

    def __init__(self, schema: type[Schema], **kwargs: Any) -> None:
        item = fields.Nested(schema, error_messages={"null": "must be an object."})
        super().__init__(item, **kwargs)


class StopSequencesField(OptionalField):
    """An array of at most ``limit`` non-empty strings: the door's own limit."""

    default_error_messages = {
        "invalid": "must be an array of strings.",
        "length": "must hold at most {limit} sequences.",
        "item": "must be a non-empty string.",
    }

    def __init__(self, limit: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limit = limit

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is not list:
            raise self.make_error("invalid")
        if len(value) > self.limit:
            raise self.make_error("length", limit=self.limit)
        for index, sequence in enumerate(value):
            if type(sequence) is not str or not sequence:
                raise ValidationError({index: [self.error_messages["item"]]})
        return value


class ObjectSchema(Schema):
    """Base of every schema: drops unknown keys and reports a non-object plainly."""

    class Meta:
        """Unknown keys are ignored, not rejected (contract section 1)."""

        unknown = EXCLUDE

    error_messages = {"type": "must be an object."}


def first_error(messages: Any) -> tuple[str, str]:
    """Walk marshmallow's error tree to its first message; return (path, message)."""
    path = ""
    while not isinstance(messages, str):
        if isinstance(messages, list):
            messages = messages[0]
            continue
        key, messages = next(iter(messages.items()))
        if isinstance(key, int):
            path += f"[{key}]"
        elif key != "_schema":
            path += f".{key}" if path else key
    return path, messages


def load_or_raise(schema: Schema, body: Any) -> Any:
    """Load ``body`` with ``schema``; raise InvalidRequest naming its first error's path."""
    try:
        return schema.load(body)
    except ValidationError as error:
        path, problem = first_error(error.messages)
        raise InvalidRequest(f"{path} {problem}", param=path) from None
