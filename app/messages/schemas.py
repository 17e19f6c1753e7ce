"""The bodies of POST /v1/messages and /v1/messages/count_tokens: Anthropic's, validated.

Unknown keys are dropped at every level (Claude Code's betas add fields every release:
refusing them makes it retry five times, dropping features), except inside free-form
objects (a tool's ``input_schema``, a ``tool_use`` input), which pass on whole. ``null``
means absent. Content blocks of a type this door does not know (a server tool's result,
a beta's block) are kept unchecked and not shown to the model, and so are tools of a
versioned type (``web_search_20250305``): only tools defined by their ``input_schema``
can run on a translated route. Errors name the first offending field as a path
(``messages[1].content[0].source.data``) and say what is wrong with it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from marshmallow import Schema, ValidationError, validates_schema
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
    StopSequencesField,
    StringField,
    load_or_raise,
)

ROLES = ("user", "assistant", "system")
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
TOOL_CHOICES = ("auto", "any", "tool", "none")
THINKING_TYPES = ("enabled", "disabled", "adaptive")
EFFORTS = ("low", "medium", "high", "xhigh", "max")
# Anthropic's custom tool names; MCP tools (``mcp__server__tool``) are often past 64.
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,128}$"
CUSTOM_TOOL = "custom"
MIN_THINKING_BUDGET = 1024
MAX_OUTPUT_TOKENS = 1_000_000
MAX_TOOLS = 512
MAX_STOP_SEQUENCES = 64
# What each type of document source is read from.
DOCUMENT_NEEDS = {"text": "data", "content": "content", "base64": "data", "url": "url"}


class ImageSource(ObjectSchema):
    """Where an image's bytes are: inline base64 of a known type, or a URL."""

    type = StringField(required=True, validate=OneOf(("base64", "url"), error=ONE_OF))
    media_type = StringField(validate=OneOf(IMAGE_MEDIA_TYPES, error=ONE_OF))
    data = StringField(validate=Length(min=1, error=NOT_EMPTY))
    url = StringField(validate=Length(min=1, error=NOT_EMPTY))

    @validates_schema
    def check_source(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require what the source's type needs."""
        needed = ("media_type", "data") if data["type"] == "base64" else ("url",)
        for name in needed:
            if name not in data:
                raise ValidationError(f"is required when type is {data['type']}.", name)


class TextBlock(ObjectSchema):
    """A ``text`` block (its ``cache_control`` and ``citations`` are not used here)."""

    type = StringField(required=True)
    text = StringField(required=True)


class ImageBlock(ObjectSchema):
    """An ``image`` block."""

    type = StringField(required=True)
    source = NestedField(ImageSource, required=True)


class ToolUseBlock(ObjectSchema):
    """A tool call of an earlier assistant turn; ``input`` passes on whole."""

    type = StringField(required=True)
    id = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    name = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    input = ObjectField(required=True)


class BlocksField(OptionalField):
    """A string, or an array of content blocks, each loaded by its type's schema.

    ``kinds`` are the block types with a schema here (every one of BLOCKS by default);
    a block of another type passes on as sent, unless ``only``: then it is refused.
    """

    def __init__(
        self, kinds: tuple[str, ...] | None = None, *, only: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.kinds = kinds
        self.only = only
        blocks = f"{' or '.join(kinds or ())} blocks" if only else "content blocks"
        self.error_messages["invalid"] = f"must be a string or an array of {blocks}."

    @functools.cached_property
    def schemas(self) -> dict[str, Schema]:
        """Return the schemas of ``kinds``, picked once.

        BLOCKS is read at the first request parsed: it is made below the block schemas.
        """
        return BLOCKS if self.kinds is None else {kind: BLOCKS[kind] for kind in self.kinds}

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is str:
            return value
        if type(value) is not list:
            raise self.make_error("invalid")
        schemas = self.schemas
        blocks = [load_block(block, index, schemas) for index, block in enumerate(value)]
        if self.only:
            for index, block in enumerate(blocks):
                if block["type"] not in schemas:
                    raise ValidationError({index: {"type": [f"must be {' or '.join(schemas)}."]}})
        return blocks


class DocumentSource(ObjectSchema):
    """A document's source: plain text, content blocks, a base64 PDF or a URL."""

    type = StringField(required=True, validate=OneOf(tuple(DOCUMENT_NEEDS), error=ONE_OF))
    media_type = StringField()
    data = StringField()
    url = StringField()
    # Anthropic's content source holds text and image blocks only.
    content = BlocksField(("text", "image"), only=True)

    @validates_schema
    def check_source(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require what the source's type needs."""
        needed = DOCUMENT_NEEDS[data["type"]]
        if needed not in data:
            raise ValidationError(f"is required when type is {data['type']}.", needed)


class DocumentBlock(ObjectSchema):
    """A ``document`` block."""

    type = StringField(required=True)
    source = NestedField(DocumentSource, required=True)
    title = StringField()


class ToolResultBlock(ObjectSchema):
    """The result of a tool call, in a user turn."""

    type = StringField(required=True)
    tool_use_id = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    content = BlocksField(("text", "image", "document"))
    is_error = BooleanField()


class ThinkingBlock(ObjectSchema):
    """An earlier turn's thinking, echoed back with its signature."""

    type = StringField(required=True)
    thinking = StringField(required=True)
    signature = StringField()


class RedactedThinkingBlock(ObjectSchema):
    """An earlier turn's thinking, encrypted."""

    type = StringField(required=True)
    data = StringField(required=True)


BLOCKS: dict[str, Schema] = {
    "text": TextBlock(),
    "image": ImageBlock(),
    "document": DocumentBlock(),
    "tool_use": ToolUseBlock(),
    "tool_result": ToolResultBlock(),
    "thinking": ThinkingBlock(),
    "redacted_thinking": RedactedThinkingBlock(),
}


def load_block(block: Any, index: int, schemas: dict[str, Schema]) -> dict[str, Any]:
    """Load one content block with the schema its ``type`` names; keep other types as sent."""
    if type(block) is not dict:
        raise ValidationError({index: ["must be an object."]})
    kind = block.get("type")
    if type(kind) is not str or not kind:
        raise ValidationError({index: {"type": ["is required."]}})
    schema = schemas.get(kind)
    if schema is None:
        return block
    try:
        return schema.load(block)
    except ValidationError as error:
        raise ValidationError({index: error.messages}) from None


class MessageParam(ObjectSchema):
    """One turn of the conversation; ``system`` turns are instructions given mid-way."""

    role = StringField(required=True, validate=OneOf(ROLES, error=ONE_OF))
    content = BlocksField(required=True)


class ToolsField(OptionalField):
    """``tools``: custom tools, checked; tools of a versioned type, kept as sent."""

    default_error_messages = {
        "invalid": "must be an array of tools.",
        "length": f"must hold at most {MAX_TOOLS} tools.",
    }

    def _deserialize(self, value, attr, data, **kwargs):
        if type(value) is not list:
            raise self.make_error("invalid")
        if len(value) > MAX_TOOLS:
            raise self.make_error("length")
        tools = [_load_tool(tool, index) for index, tool in enumerate(value)]
        _check_unique_names(tools)
        return tools


class CustomTool(ObjectSchema):
    """A tool the caller runs, defined by the JSON Schema of its input."""

    type = StringField()
    name = StringField(
        required=True,
        validate=Regexp(
            TOOL_NAME_PATTERN, error="must be 1 to 128 letters, digits, underscores or dashes."
        ),
    )
    description = StringField()
    input_schema = ObjectField(required=True)
    defer_loading = BooleanField()


_CUSTOM_TOOL = CustomTool()


def _load_tool(tool: Any, index: int) -> dict[str, Any]:
    if type(tool) is not dict:
        raise ValidationError({index: ["must be an object."]})
    kind = tool.get("type")
    if kind is not None and kind != CUSTOM_TOOL:
        if type(kind) is not str:
            raise ValidationError({index: {"type": ["must be a string."]}})
        return tool
    try:
        return _CUSTOM_TOOL.load(tool)
    except ValidationError as error:
        raise ValidationError({index: error.messages}) from None


def _check_unique_names(tools: list[dict[str, Any]]) -> None:
    names: set[Any] = set()
    for index, tool in enumerate(tools):
        name = tool.get("name")
        if name in names:
            problem = f"must be unique; {name!r} is already used."
            raise ValidationError({index: {"name": [problem]}})
        names.add(name)


class ToolChoice(ObjectSchema):
    """How the model may use the tools: auto, any, one named tool, or none."""

    type = StringField(required=True, validate=OneOf(TOOL_CHOICES, error=ONE_OF))
    name = StringField()
    disable_parallel_tool_use = BooleanField()

    @validates_schema
    def check_name(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require a name when one tool is forced."""
        if data["type"] == "tool" and "name" not in data:
            raise ValidationError("is required when type is tool.", "name")


class Thinking(ObjectSchema):
    """Extended thinking: enabled with a token budget, adaptive, or disabled."""

    type = StringField(required=True, validate=OneOf(THINKING_TYPES, error=ONE_OF))
    budget_tokens = IntegerField(
        validate=Range(MIN_THINKING_BUDGET, MAX_OUTPUT_TOKENS, error=BETWEEN)
    )
    display = StringField(validate=OneOf(("summarized", "omitted"), error=ONE_OF))

    @validates_schema
    def check_budget(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require a budget when thinking is enabled."""
        if data["type"] == "enabled" and "budget_tokens" not in data:
            raise ValidationError("is required when type is enabled.", "budget_tokens")


class Metadata(ObjectSchema):
    """Who the request is for: ``user_id``, an opaque string."""

    user_id = StringField()


class OutputFormat(ObjectSchema):
    """Structured output: JSON matching a schema."""

    type = StringField(required=True, validate=OneOf(("json_schema",), error=ONE_OF))
    schema = ObjectField(required=True)


class OutputConfig(ObjectSchema):
    """How much effort to spend, and in what format to answer."""

    effort = StringField(validate=OneOf(EFFORTS, error=ONE_OF))
    format = NestedField(OutputFormat)


class CountTokensRequest(ObjectSchema):
    """The body of POST /v1/messages/count_tokens: what makes up a prompt."""

    model = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    messages = ListOf(MessageParam, required=True, validate=Length(min=1, error=NOT_EMPTY))
    system = BlocksField(("text",), only=True)
    tools = ToolsField()
    tool_choice = NestedField(ToolChoice)
    thinking = NestedField(Thinking)
    output_config = NestedField(OutputConfig)


class MessageCreateRequest(CountTokensRequest):
    """The body of POST /v1/messages: a prompt, and how to answer it."""

    max_tokens = IntegerField(required=True, validate=Range(1, MAX_OUTPUT_TOKENS, error=BETWEEN))
    stream = BooleanField()
    temperature = NumberField(validate=Range(0, 1, error=BETWEEN))
    top_p = NumberField(validate=Range(0, 1, error=BETWEEN))
    top_k = IntegerField(validate=Range(0, None, error="must be at least {min}."))
    stop_sequences = StopSequencesField(MAX_STOP_SEQUENCES)
    metadata = NestedField(Metadata)

    @validates_schema
    def check_thinking_budget(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Keep the thinking budget below max_tokens, as the API requires."""
        budget = (data.get("thinking") or {}).get("budget_tokens")
        if budget is not None and budget >= data["max_tokens"]:
            raise ValidationError(
                {"thinking": {"budget_tokens": ["must be less than max_tokens."]}}
            )


@dataclass(frozen=True)
class MessagesRequest:
    """A validated Messages request: the fields this door reads, and the caller's others.

    ``params`` holds the optional fields the caller set, under their Anthropic names;
    ``extra`` the top-level fields this door does not know, unchecked, as the Chat
    Completions door keeps them (a catalog entry's ``extra_params`` may forward them).
    """

    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    stream: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


_CREATE_SCHEMA = MessageCreateRequest()
_COUNT_SCHEMA = CountTokensRequest()
_CREATE_FIELDS = frozenset(_CREATE_SCHEMA.fields)


def parse_messages_request(body: Any) -> MessagesRequest:
    """Validate the body of POST /v1/messages; raise InvalidRequest naming the field."""
    params = _load_object(_CREATE_SCHEMA, body)
    return MessagesRequest(
        model=params.pop("model"),
        messages=params.pop("messages"),
        max_tokens=params.pop("max_tokens"),
        stream=params.pop("stream", False),
        params=params,
        extra={key: value for key, value in body.items() if key not in _CREATE_FIELDS},
    )


def parse_count_tokens_request(body: Any) -> MessagesRequest:
    """Validate the body of POST /v1/messages/count_tokens; raise InvalidRequest."""
    params = _load_object(_COUNT_SCHEMA, body)
    return MessagesRequest(
        model=params.pop("model"), messages=params.pop("messages"), params=params
    )


def _load_object(schema: Schema, body: Any) -> dict[str, Any]:
    if type(body) is not dict:
        raise InvalidRequest("The request body must be a JSON object.")
    return load_or_raise(schema, body)
