"""The body of POST /v1/responses: marshmallow schemas and ``parse_response_request``.

The rules are OpenAI's for the fields the gateway serves. Unknown keys are dropped, and
so are input items and tools of types the gateway cannot serve (hosted tools such as
``web_search``, custom tools, their calls): they are not offered to the model rather
than refused, as Codex sends some on every request. Content parts of other types than
text, images and refusals (``input_file``, ``input_audio``) and images by ``file_id`` are
kept as sent: a route that passes requests through sends them, counted; the translation
refuses them. ``input`` comes out as a list of items in one shape: a string is one user
message, every message's content a list of parts, a message or reference without
``type`` typed. Errors name the first offending field as a path
(``input[2].content[0].text``) and say what is wrong with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marshmallow import ValidationError, validates_schema
from marshmallow.validate import Length, OneOf, Range, Regexp

from app.errors import InvalidRequest
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
    load_or_raise,
)

INPUT_ROLES = ("user", "system", "developer", "assistant")
IMAGE_DETAILS = ("low", "high", "auto", "original")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
SUMMARIES = ("auto", "concise", "detailed")
VERBOSITIES = ("low", "medium", "high")
TEXT_FORMATS = ("text", "json_object", "json_schema")
TOOL_CHOICE_MODES = frozenset({"none", "auto", "required"})
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
TOOL_NAME_RULE = "must be 1 to 64 letters, digits, underscores or dashes."
# A namespace's function is offered to chat models as "<namespace>__<name>".
NAMESPACE_SEPARATOR = "__"
MAX_TOOLS = 128
MAX_INPUT_ITEMS = 10_000
MAX_OUTPUT_TOKENS = 1_000_000
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
# Fields asking for state the gateway does not keep: answering without it would be
# answering another question.
UNSERVED_FIELDS = {
    "conversation": "Conversations are not served here: continue with previous_response_id.",
    "prompt": "Stored prompt templates are not served here: send the input itself.",
}


class TextPart(ObjectSchema):
    """An ``input_text`` or ``output_text`` part: its text."""

    text = StringField(required=True)


class ImagePart(ObjectSchema):
    """An ``input_image`` part: an image URL or a base64 ``data:`` URI."""

    image_url = StringField(validate=Length(min=1, error=NOT_EMPTY))
    file_id = StringField()
    detail = StringField(load_default="auto", validate=OneOf(IMAGE_DETAILS, error=ONE_OF))

    @validates_schema
    def check_source(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require the image: by URL or data: URI, or an upstream's file id."""
        if "image_url" not in data and "file_id" not in data:
            problem = "is required: an image is sent by URL or data: URI, or by file_id."
            raise ValidationError(problem, "image_url")


class RefusalPart(ObjectSchema):
    """A ``refusal`` part of an earlier assistant message."""

    refusal = StringField(required=True)


PART_SCHEMAS = {
    "input_text": TextPart(),
    "output_text": TextPart(),
    "input_image": ImagePart(),
    "refusal": RefusalPart(),
}


def load_part(part: Any, index: int) -> dict[str, Any]:
    """Load one content part with the schema its ``type`` names; keep other types as sent."""
    if type(part) is not dict:
        raise ValidationError({index: ["must be an object."]})
    part_type = part.get("type")
    if type(part_type) is not str:
        problem = "is required." if part_type is None else "must be a string."
        raise ValidationError({index: {"type": [problem]}})
    schema = PART_SCHEMAS.get(part_type)
    if schema is None:
        return part
    try:
        loaded = schema.load(part)
    except ValidationError as error:
        raise ValidationError({index: error.messages}) from None
    loaded["type"] = part_type
    if part_type == "output_text":
        loaded["annotations"] = []
    return loaded


class ContentField(OptionalField):
    """A message's ``content``: a string, or an array of parts; loaded as parts."""

    default_error_messages = {"invalid": "must be a string or an array of content parts."}

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is str:
            return value
        if type(value) is not list:
            raise self.make_error("invalid")
        return [load_part(part, index) for index, part in enumerate(value)]


class OutputField(OptionalField):
    """A function call's ``output``: a string, or an array of text and image parts."""

    default_error_messages = {"invalid": "must be a string or an array of content parts."}

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is str:
            return value
        if type(value) is not list:
            raise self.make_error("invalid")
        # Parts of other kinds (Codex's encrypted_content) carry nothing a model reads.
        return [
            load_part(part, index)
            for index, part in enumerate(value)
            if type(part) is not dict or part.get("type") in ("input_text", "input_image")
        ]


class MessageItem(ObjectSchema):
    """A message: the caller's, a system or developer instruction, or an earlier answer."""

    id = StringField()
    role = StringField(required=True, validate=OneOf(INPUT_ROLES, error=ONE_OF))
    content = ContentField(required=True)


class FunctionCallItem(ObjectSchema):
    """A function call the model made earlier, as the caller sends it back."""

    id = StringField()
    call_id = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    name = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    arguments = StringField(required=True)
    namespace = StringField()


class FunctionCallOutputItem(ObjectSchema):
    """What the caller's function returned for a call."""

    id = StringField()
    call_id = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    output = OutputField(required=True)


class ReasoningItem(ObjectSchema):
    """An earlier answer's reasoning, sent back; kept, never shown to a chat model."""

    id = StringField()
    summary = ListOf(TextPart)
    encrypted_content = StringField()


class ItemReference(ObjectSchema):
    """A reference to an item of a stored response, by its id."""

    id = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))


ITEM_SCHEMAS = {
    "message": MessageItem(),
    "function_call": FunctionCallItem(),
    "function_call_output": FunctionCallOutputItem(),
    "reasoning": ReasoningItem(),
    "item_reference": ItemReference(),
}


def item_type(item: dict[str, Any]) -> Any:
    """Return an item's type; a message (role) or a reference (id alone) may leave it out."""
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    if kind is None and "id" in item:
        return "item_reference"
    return kind


def load_item(item: Any, index: int) -> dict[str, Any]:
    """Load one input item by its type; items of other (hosted tools') types pass whole."""
    if type(item) is not dict:
        raise ValidationError({index: ["must be an object."]})
    kind = item_type(item)
    if type(kind) is not str:
        raise ValidationError({index: {"type": ["must be a string." if kind else "is required."]}})
    schema = ITEM_SCHEMAS.get(kind)
    if schema is None:
        return item
    try:
        loaded = schema.load(item)
    except ValidationError as error:
        raise ValidationError({index: error.messages}) from None
    loaded["type"] = kind
    if kind == "message":
        loaded["content"] = message_parts(loaded["role"], loaded["content"])
    return loaded


def message_parts(role: str, content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return a message's content as parts: a string is one text part of the role's kind."""
    if type(content) is not str:
        return content
    if role == "assistant":
        return [{"type": "output_text", "text": content, "annotations": []}]
    return [{"type": "input_text", "text": content}]


class InputField(OptionalField):
    """``input``: a string (one user message) or an array of items; loaded as items."""

    default_error_messages = {
        "invalid": "must be a string or an array of items.",
        "length": f"must hold at most {MAX_INPUT_ITEMS} items.",
    }

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is str:
            return [{"type": "message", "role": "user", "content": message_parts("user", value)}]
        if type(value) is not list:
            raise self.make_error("invalid")
        if len(value) > MAX_INPUT_ITEMS:
            raise self.make_error("length")
        return [load_item(item, index) for index, item in enumerate(value)]


class FunctionTool(ObjectSchema):
    """A function the model may call; ``parameters`` is a JSON Schema, passed on whole."""

    type = StringField(required=True)
    name = StringField(required=True, validate=Regexp(TOOL_NAME_PATTERN, error=TOOL_NAME_RULE))
    description = StringField()
    parameters = ObjectField()
    strict = BooleanField()


class ToolsField(OptionalField):
    """An array of tools: those of ``schemas``' types are loaded, others kept as sent."""

    default_error_messages = {"invalid": "must be an array of tools."}

    def __init__(self, schemas: dict[str, ObjectSchema], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.schemas = schemas

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is not list:
            raise self.make_error("invalid")
        return [self.load_tool(tool, index) for index, tool in enumerate(value)]

    def load_tool(self, tool: Any, index: int) -> dict[str, Any]:
        """Load one tool by its type."""
        if type(tool) is not dict:
            raise ValidationError({index: ["must be an object."]})
        if type(tool.get("type")) is not str:
            raise ValidationError({index: {"type": ["must be a string."]}})
        schema = self.schemas.get(tool["type"])
        if schema is None:
            return tool
        try:
            return schema.load(tool)
        except ValidationError as error:
            raise ValidationError({index: error.messages}) from None


class NamespaceTool(ObjectSchema):
    """A named group of tools; its functions are offered under the group's name."""

    type = StringField(required=True)
    name = StringField(required=True, validate=Regexp(TOOL_NAME_PATTERN, error=TOOL_NAME_RULE))
    description = StringField()
    tools = ToolsField({"function": FunctionTool()}, required=True)

    @validates_schema
    def check_names(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require each function's name with the group's to fit a function name."""
        for index, tool in enumerate(data["tools"]):
            if tool["type"] == "function":
                offered = data["name"] + NAMESPACE_SEPARATOR + tool["name"]
                if len(offered) > 64:
                    problem = f"makes {offered!r} with its namespace: over 64 characters."
                    raise ValidationError({"tools": {index: {"name": [problem]}}})


class ToolChoiceField(OptionalField):
    """``tool_choice``: a mode, a function by name, or the allowed tools and a mode."""

    default_error_messages = {
        "invalid": (
            'must be "none", "auto", "required", a function by name, or allowed_tools; '
            "the tools it names must be functions."
        )
    }

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is str and value in TOOL_CHOICE_MODES:
            return value
        if type(value) is dict and value.get("type") == "function" and _named(value):
            return {"type": "function", "name": value["name"]}
        if type(value) is dict and value.get("type") == "allowed_tools":
            tools = value.get("tools")
            if value.get("mode") in ("auto", "required") and type(tools) is list:
                if all(
                    type(t) is dict and t.get("type") == "function" and _named(t) for t in tools
                ):
                    names = [{"type": "function", "name": t["name"]} for t in tools]
                    return {"type": "allowed_tools", "mode": value["mode"], "tools": names}
        raise self.make_error("invalid")


def _named(tool: dict[str, Any]) -> bool:
    return type(tool.get("name")) is str


class Reasoning(ObjectSchema):
    """How much the model reasons, and whether a summary is asked for."""

    effort = StringField(validate=OneOf(REASONING_EFFORTS, error=ONE_OF))
    summary = StringField(validate=OneOf(SUMMARIES, error=ONE_OF))


class TextFormat(ObjectSchema):
    """The output format asked for: text, any JSON object, or JSON matching a schema."""

    type = StringField(required=True, validate=OneOf(TEXT_FORMATS, error=ONE_OF))
    name = StringField()
    schema = ObjectField()
    strict = BooleanField()
    description = StringField()

    @validates_schema
    def check_json_schema(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require a json_schema format's name and schema."""
        if data["type"] != "json_schema":
            return
        for name in ("name", "schema"):
            if name not in data:
                raise ValidationError("is required when type is json_schema.", name)


class TextOptions(ObjectSchema):
    """``text``: the output format and verbosity."""

    format = NestedField(TextFormat)
    verbosity = StringField(validate=OneOf(VERBOSITIES, error=ONE_OF))


class MetadataField(OptionalField):
    """``metadata``: up to 16 string values under keys of up to 64 characters."""

    default_error_messages = {
        "invalid": (
            f"must be an object of at most {MAX_METADATA_KEYS} strings of at most "
            f"{MAX_METADATA_VALUE} characters, under keys of at most {MAX_METADATA_KEY}."
        )
    }

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is not dict or len(value) > MAX_METADATA_KEYS:
            raise self.make_error("invalid")
        for key, text in value.items():
            if (
                len(key) > MAX_METADATA_KEY
                or type(text) is not str
                or len(text) > MAX_METADATA_VALUE
            ):
                raise self.make_error("invalid")
        return value


class StringsField(OptionalField):
    """An array of strings."""

    default_error_messages = {"invalid": "must be an array of strings."}

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is not list or any(type(item) is not str for item in value):
            raise self.make_error("invalid")
        return value


class ResponseCreateRequest(ObjectSchema):
    """The body of POST /v1/responses: the fields the gateway serves or echoes."""

    model = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    input = InputField()
    instructions = StringField()
    tools = ToolsField({"function": FunctionTool(), "namespace": NamespaceTool()})
    tool_choice = ToolChoiceField()
    parallel_tool_calls = BooleanField()
    max_output_tokens = IntegerField(validate=Range(1, MAX_OUTPUT_TOKENS, error=BETWEEN))
    temperature = NumberField(validate=Range(0, 2, error=BETWEEN))
    top_p = NumberField(validate=Range(0, 1, error=BETWEEN))
    top_logprobs = IntegerField(validate=Range(0, 20, error=BETWEEN))
    reasoning = NestedField(Reasoning)
    text = NestedField(TextOptions)
    # openai-python's responses.parse(verbosity=...) sends it here, not in text.
    verbosity = StringField(validate=OneOf(VERBOSITIES, error=ONE_OF))
    stream = BooleanField()
    store = BooleanField()
    background = BooleanField()
    previous_response_id = StringField(validate=Length(min=1, error=NOT_EMPTY))
    metadata = MetadataField()
    include = StringsField()
    user = StringField()
    safety_identifier = StringField()
    prompt_cache_key = StringField()
    truncation = StringField(validate=OneOf(("auto", "disabled"), error=ONE_OF))
    service_tier = StringField()

    @validates_schema
    def check_served(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Refuse background runs, which the gateway answers only in the foreground."""
        if data.get("background"):
            raise ValidationError(
                "is not served here: responses are answered at once.", "background"
            )


@dataclass(frozen=True)
class ResponseRequest:
    """A validated Responses API request.

    ``input`` holds its items in one shape (see the module); ``params`` every other
    field the caller set, under its Responses name; ``extra`` the caller's top-level
    fields the gateway does not know, unchecked, which a model's catalog entry may let
    through (``extra_params``), as for chat completions.
    """

    model: str
    input: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def stream(self) -> bool:
        """Whether the answer is streamed."""
        return self.params.get("stream", False)

    @property
    def store(self) -> bool:
        """Whether the response is kept (OpenAI's default: yes)."""
        return self.params.get("store", True)


_REQUEST_SCHEMA = ResponseCreateRequest()
_KNOWN_FIELDS = frozenset(_REQUEST_SCHEMA.fields) | frozenset(UNSERVED_FIELDS)
# What clients send that the gateway reads nowhere and forwards nowhere.
_IGNORED_FIELDS = frozenset({"stream_options", "client_metadata", "max_tool_calls"})


def parse_response_request(body: Any) -> ResponseRequest:
    """Validate a decoded JSON body; raise InvalidRequest naming the offending param."""
    if type(body) is not dict:
        raise InvalidRequest("The request body must be a JSON object.")
    for name, problem in UNSERVED_FIELDS.items():
        if body.get(name) is not None:
            raise InvalidRequest(problem, param=name)
    params = load_or_raise(_REQUEST_SCHEMA, body)
    return ResponseRequest(
        model=params.pop("model"),
        input=params.pop("input", []),
        params=params,
        extra={
            key: value
            for key, value in body.items()
            if key not in _KNOWN_FIELDS and key not in _IGNORED_FIELDS
        },
    )
