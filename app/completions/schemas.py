"""The body of POST /v1/chat/completions: marshmallow schemas and ``parse_chat_request``.

The rules are the contract's sections 2.1 to 2.6 and 8. Unknown keys are dropped at every
level except inside free-form objects (function parameters, a JSON schema, logit_bias),
which pass on whole. ``null`` means absent. Types are strict, as JSON types: ``1`` is no
boolean, ``"1"`` no integer, ``1.5`` no integer. Errors name the first offending field as a
path (``messages[1].content[0].image_url.url``) and say what is wrong with it.
"""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, ValidationError, validates_schema
from marshmallow.validate import Length, OneOf, Range, Regexp

from app.errors import InvalidRequest
from app.providers.base import REASONING_EFFORTS, ChatRequest
from app.validation import (
    BETWEEN,
    NOT_EMPTY,
    ONE_OF,
    BooleanField,
    IntegerField,
    ListOf,
    NestedField,
    NumberField,
    ObjectField,
    ObjectSchema,
    OptionalField,
    StringField,
    WholeObjectField,
    first_error,
)

ROLES = ("system", "developer", "user", "assistant", "tool")
IMAGE_DETAILS = ("low", "high", "auto")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
TOOL_CHOICE_MODES = frozenset({"none", "auto", "required"})
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
MAX_STOP_SEQUENCES = 4
MAX_TOOLS = 128
MAX_OUTPUT_TOKENS = 1_000_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _developer_as_system(role: str) -> str:
    # OpenAI's SDKs send "developer" to newer models; the contract's roles (and so the
    # adapters') are system, user, assistant and tool.
    return "system" if role == "developer" else role


class StopField(OptionalField):
    """``stop``: a string, or an array of 1 to 4 non-empty strings."""

    default_error_messages = {
        "invalid": "must be a string or an array of strings.",
        "length": f"must hold between 1 and {MAX_STOP_SEQUENCES} sequences.",
        "item": "must be a non-empty string.",
    }

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is str:
            return value
        if type(value) is not list:
            raise self.make_error("invalid")
        if not 1 <= len(value) <= MAX_STOP_SEQUENCES:
            raise self.make_error("length")
        for index, sequence in enumerate(value):
            if type(sequence) is not str or not sequence:
                raise ValidationError({index: [self.error_messages["item"]]})
        return value


class LogitBiasField(OptionalField):
    """``logit_bias``: an object whose values are numbers from -100 to 100, passed on whole."""

    default_error_messages = {
        "invalid": "must be an object mapping token ids to numbers.",
        "bias": "values must be numbers between -100 and 100.",
    }

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is not dict:
            raise self.make_error("invalid")
        for bias in value.values():
            if type(bias) not in (int, float) or not -100 <= bias <= 100:
                raise self.make_error("bias")
        return value


class ToolChoiceField(OptionalField):
    """``tool_choice``: a mode, or ``{"type": "function", "function": {"name": ...}}``."""

    default_error_messages = {
        "invalid": 'must be "none", "auto", "required" or an object naming a function.'
    }

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is str and value in TOOL_CHOICE_MODES:
            return value
        if type(value) is dict and value.get("type") == "function":
            function = value.get("function")
            if type(function) is dict and type(function.get("name")) is str:
                return {"type": "function", "function": {"name": function["name"]}}
        raise self.make_error("invalid")


class ContentField(OptionalField):
    """A message's ``content``: a string, or a non-empty array of text and image parts."""

    default_error_messages = {
        "invalid": "must be a string or an array of content parts.",
        "empty": NOT_EMPTY,
    }

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is str:
            return value
        if type(value) is not list:
            raise self.make_error("invalid")
        if not value:
            raise self.make_error("empty")
        return [_load_part(part, index) for index, part in enumerate(value)]


def _load_part(part: Any, index: int) -> dict[str, Any]:
    """Load one content part with the schema its ``type`` names."""
    if type(part) is not dict:
        raise ValidationError({index: ["must be an object."]})
    part_type = part.get("type")
    schema = PART_SCHEMAS.get(part_type) if type(part_type) is str else None
    if schema is None:
        problem = "is required." if part_type is None else ONE_OF.format(choices="text, image_url")
        raise ValidationError({index: {"type": [problem]}})
    try:
        return schema.load(part)
    except ValidationError as error:
        raise ValidationError({index: error.messages}) from None


class TextPart(ObjectSchema):
    """A ``text`` content part."""

    type = StringField(required=True)
    text = StringField(required=True)


class ImageUrl(ObjectSchema):
    """The ``image_url`` of an image part: a URL or a base64 ``data:`` URI."""

    url = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    detail = StringField(load_default="auto", validate=OneOf(IMAGE_DETAILS, error=ONE_OF))


class ImagePart(ObjectSchema):
    """An ``image_url`` content part."""

    type = StringField(required=True)
    image_url = NestedField(ImageUrl, required=True)


PART_SCHEMAS: dict[str, Schema] = {"text": TextPart(), "image_url": ImagePart()}


class ToolCallFunction(ObjectSchema):
    """The function an assistant called, with its JSON-encoded arguments."""

    name = StringField(required=True)
    arguments = StringField(required=True)


class ToolCall(ObjectSchema):
    """A tool call an assistant made earlier in the conversation."""

    id = StringField(required=True)
    type = StringField(required=True, validate=OneOf(("function",), error=ONE_OF))
    function = NestedField(ToolCallFunction, required=True)


class ChatMessage(ObjectSchema):
    """One message of the conversation; ``developer`` is loaded as ``system``."""

    role = StringField(
        required=True, validate=OneOf(ROLES, error=ONE_OF), post_load=_developer_as_system
    )
    content = ContentField()
    name = StringField()
    tool_call_id = StringField()
    tool_calls = ListOf(ToolCall)

    @validates_schema
    def check_role_fields(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require what the role needs: tool messages a call id, every role some content."""
        role = data["role"]
        if "tool_calls" in data and role != "assistant":
            raise ValidationError("is only allowed on assistant messages.", "tool_calls")
        if role == "tool" and "tool_call_id" not in data:
            raise ValidationError("is required on tool messages.", "tool_call_id")
        if "content" in data:
            return
        if role != "assistant":
            raise ValidationError("is required.", "content")
        if "tool_calls" not in data:
            raise ValidationError("is required when tool_calls is absent.", "content")


class StreamOptions(ObjectSchema):
    """Options of a streamed answer."""

    include_usage = BooleanField()


class JsonSchemaFormat(ObjectSchema):
    """The ``json_schema`` of a ``response_format`` (checked, then passed on whole)."""

    name = StringField(required=True)
    schema = ObjectField()
    strict = BooleanField()
    description = StringField()


class ResponseFormat(ObjectSchema):
    """The output format asked for: text, any JSON object, or JSON matching a schema."""

    type = StringField(required=True, validate=OneOf(RESPONSE_FORMATS, error=ONE_OF))
    json_schema = WholeObjectField(JsonSchemaFormat)

    @validates_schema
    def check_json_schema(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require ``json_schema`` when the type says so."""
        if data["type"] == "json_schema" and "json_schema" not in data:
            raise ValidationError("is required when type is json_schema.", "json_schema")


class FunctionDefinition(ObjectSchema):
    """A function the model may call; ``parameters`` is a JSON Schema, passed on whole."""

    name = StringField(
        required=True,
        validate=Regexp(
            TOOL_NAME_PATTERN, error="must be 1 to 64 letters, digits, underscores or dashes."
        ),
    )
    description = StringField()
    parameters = ObjectField()
    strict = BooleanField()


class Tool(ObjectSchema):
    """A tool the model may call (only functions exist)."""

    type = StringField(required=True, validate=OneOf(("function",), error=ONE_OF))
    function = NestedField(FunctionDefinition, required=True)


class ChatCompletionRequest(ObjectSchema):
    """The body of POST /v1/chat/completions, fields in the contract's order."""

    model = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    messages = ListOf(ChatMessage, required=True, validate=Length(min=1, error=NOT_EMPTY))
    temperature = NumberField(validate=Range(0, 2, error=BETWEEN))
    top_p = NumberField(validate=Range(0, 1, error=BETWEEN))
    max_tokens = IntegerField(validate=Range(1, MAX_OUTPUT_TOKENS, error=BETWEEN))
    max_completion_tokens = IntegerField(validate=Range(1, MAX_OUTPUT_TOKENS, error=BETWEEN))
    reasoning_effort = StringField(validate=OneOf(REASONING_EFFORTS, error=ONE_OF))
    stop = StopField()
    stream = BooleanField()
    stream_options = NestedField(StreamOptions)
    seed = IntegerField(validate=Range(INT64_MIN, INT64_MAX, error="must fit in 64 bits."))
    n = IntegerField(validate=Range(1, 16, error=BETWEEN))
    frequency_penalty = NumberField(validate=Range(-2, 2, error=BETWEEN))
    presence_penalty = NumberField(validate=Range(-2, 2, error=BETWEEN))
    logit_bias = LogitBiasField()
    logprobs = BooleanField()
    top_logprobs = IntegerField(validate=Range(0, 20, error=BETWEEN))
    response_format = NestedField(ResponseFormat)
    tools = ListOf(Tool, validate=Length(max=MAX_TOOLS, error="must hold at most {max} tools."))
    tool_choice = ToolChoiceField()
    parallel_tool_calls = BooleanField()
    user = StringField()

    @validates_schema
    def check_related_fields(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Check the rules that tie fields together, in the contract's field order."""
        if "top_logprobs" in data and data.get("logprobs") is not True:
            raise ValidationError("is only allowed when logprobs is true.", "top_logprobs")
        tool_names = _unique_tool_names(data.get("tools", ()))
        _check_tool_choice(data.get("tool_choice", "none"), tool_names)


def _unique_tool_names(tools: list[dict[str, Any]]) -> set[str]:
    """Collect the tools' names, refusing two tools that share one."""
    names: set[str] = set()
    for index, tool in enumerate(tools):
        name = tool["function"]["name"]
        if name in names:
            problem = f"must be unique; {name!r} is already used."
            raise ValidationError({"tools": {index: {"function": {"name": [problem]}}}})
        names.add(name)
    return names


def _check_tool_choice(choice: str | dict[str, Any], tool_names: set[str]) -> None:
    """Require tools for any choice but none, and a named choice to be one of them."""
    if choice == "none":
        return
    if not tool_names:
        raise ValidationError("is only allowed when tools are given.", "tool_choice")
    if type(choice) is dict and choice["function"]["name"] not in tool_names:
        problem = f"names {choice['function']['name']!r}, which is not one of the tools."
        raise ValidationError(problem, "tool_choice")


_REQUEST_SCHEMA = ChatCompletionRequest()
_REQUEST_FIELDS = frozenset(_REQUEST_SCHEMA.fields)


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded JSON body; raise InvalidRequest naming the offending param."""
    if type(body) is not dict:
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        params = _REQUEST_SCHEMA.load(body)
    except ValidationError as error:
        path, problem = first_error(error.messages)
        raise InvalidRequest(f"{path} {problem}", param=path) from None
    model = params.pop("model")
    messages = params.pop("messages")
    stream = params.pop("stream", False)
    stream_options = params.pop("stream_options", {})
    return ChatRequest(
        model=model,
        messages=messages,
        params=params,
        stream=stream,
        include_usage=stream and stream_options.get("include_usage", False),
        # Kept aside, not validated: only a model's catalog entry can let them through.
        extra={key: value for key, value in body.items() if key not in _REQUEST_FIELDS},
    )
