"""The bodies of generateContent, streamGenerateContent and countTokens: Google's, validated.

Google's API reads each field by its camelCase or its snake_case name (``maxOutputTokens``
or ``max_output_tokens``); so does this door: snake_case keys are renamed before the body
is checked, except inside free-form objects (a call's ``args``, a function's ``response``,
a schema's properties), which pass on whole. Unknown keys are dropped (Google adds fields
every release), ``null`` means absent, parts of a kind this door does not know are kept
unchecked and not shown to the model, and so are Google's hosted tools (``googleSearch``,
``codeExecution``...): only ``functionDeclarations`` can run on a translated route.
Errors name the first offending field as a path (``contents[1].parts[0].inlineData.data``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from marshmallow import ValidationError, validates_schema
from marshmallow.validate import Length, OneOf, Range

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

ROLES = ("user", "model", "function", "system")
MODES = ("AUTO", "ANY", "NONE", "VALIDATED", "MODE_UNSPECIFIED")
THINKING_LEVELS = ("MINIMAL", "LOW", "MEDIUM", "HIGH", "THINKING_LEVEL_UNSPECIFIED")
MAX_OUTPUT_TOKENS = 1_000_000
MAX_STOP_SEQUENCES = 5
MAX_CANDIDATES = 8
# Objects whose keys are the caller's own (arguments, results, JSON Schemas): never renamed.
FREE_FORM = frozenset(
    {"args", "response", "parameters", "parametersJsonSchema", "responseSchema",
     "responseJsonSchema", "responseJsonSchemaOrdering", "labels"}
)  # fmt: skip


def camel(name: str) -> str:
    """Return a snake_case name in camelCase (a camelCase one as it is)."""
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def camel_keys(value: Any) -> Any:
    """Return ``value`` with every object's snake_case keys in camelCase, free-form ones kept.

    A key sent under both names keeps the camelCase one's value, as it was sent.
    """
    if type(value) is list:
        return [camel_keys(item) for item in value]
    if type(value) is not dict:
        return value
    renamed: dict[str, Any] = {}
    for key, item in value.items():
        name = camel(key) if type(key) is str and "_" in key else key
        if name in renamed and name != key:
            continue
        renamed[name] = item if name in FREE_FORM else camel_keys(item)
    return renamed


class Blob(ObjectSchema):
    """Inline bytes: their media type and base64 data."""

    mimeType = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    data = StringField(required=True)


class FileData(ObjectSchema):
    """A file by reference: its media type and URI."""

    mimeType = StringField()
    fileUri = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))


class FunctionCall(ObjectSchema):
    """A function call of an earlier model turn; ``args`` passes on whole."""

    id = StringField()
    name = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    args = ObjectField()


class FunctionResponse(ObjectSchema):
    """A function's result, sent back for its call; ``response`` passes on whole."""

    id = StringField()
    name = StringField(required=True, validate=Length(min=1, error=NOT_EMPTY))
    response = ObjectField()


class Part(ObjectSchema):
    """One part of a turn: text (a thought, when ``thought``), data, a call or its result."""

    text = StringField()
    thought = BooleanField()
    thoughtSignature = StringField()
    inlineData = NestedField(Blob)
    fileData = NestedField(FileData)
    functionCall = NestedField(FunctionCall)
    functionResponse = NestedField(FunctionResponse)


class Content(ObjectSchema):
    """A turn: its role (``user`` when absent) and its parts."""

    role = StringField(validate=OneOf(ROLES, error=ONE_OF))
    parts = ListOf(Part, required=True)


class FunctionDeclaration(ObjectSchema):
    """A function the model may call: its parameters as Google's Schema or as JSON Schema."""

    name = StringField(required=True, validate=Length(min=1, max=128, error=BETWEEN))
    description = StringField()
    parameters = ObjectField()
    parametersJsonSchema = ObjectField()


class Tool(ObjectSchema):
    """A tool entry: function declarations; Google's hosted tools are kept but not offered."""

    functionDeclarations = ListOf(FunctionDeclaration)


class FunctionCallingConfig(ObjectSchema):
    """How the model may call functions, and which."""

    mode = StringField(validate=OneOf(MODES, error=ONE_OF))
    allowedFunctionNames = OptionalField()

    @validates_schema
    def check_names(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require the allowed names to be an array of strings."""
        names = data.get("allowedFunctionNames")
        if names is not None and (
            type(names) is not list or any(type(name) is not str for name in names)
        ):
            raise ValidationError("must be an array of strings.", "allowedFunctionNames")


class ToolConfig(ObjectSchema):
    """The tools' configuration: function calling's."""

    functionCallingConfig = NestedField(FunctionCallingConfig)


class ThinkingConfig(ObjectSchema):
    """How much to think, and whether to show thought summaries."""

    includeThoughts = BooleanField()
    thinkingBudget = IntegerField(validate=Range(-1, MAX_OUTPUT_TOKENS, error=BETWEEN))
    thinkingLevel = StringField(validate=OneOf(THINKING_LEVELS, error=ONE_OF))


class GenerationConfig(ObjectSchema):
    """How to answer: length, sampling, stops, format, thinking."""

    maxOutputTokens = IntegerField(validate=Range(1, MAX_OUTPUT_TOKENS, error=BETWEEN))
    candidateCount = IntegerField(validate=Range(1, MAX_CANDIDATES, error=BETWEEN))
    temperature = NumberField(validate=Range(0, 2, error=BETWEEN))
    topP = NumberField(validate=Range(0, 1, error=BETWEEN))
    # A number in Google's API (the SDKs send 20.0): read as the whole number of tokens.
    topK = NumberField(validate=Range(1, 10**9, error=BETWEEN))
    seed = IntegerField()
    presencePenalty = NumberField(validate=Range(-2, 2, error=BETWEEN))
    frequencyPenalty = NumberField(validate=Range(-2, 2, error=BETWEEN))
    stopSequences = StopSequencesField(MAX_STOP_SEQUENCES)
    responseMimeType = StringField()
    responseSchema = ObjectField()
    responseJsonSchema = ObjectField()
    thinkingConfig = NestedField(ThinkingConfig)


class CountTokensRequest(ObjectSchema):
    """What makes up a prompt: its turns, system instruction and tools."""

    contents = ListOf(Content)
    systemInstruction = NestedField(Content)
    tools = ListOf(Tool)
    toolConfig = NestedField(ToolConfig)
    generationConfig = NestedField(GenerationConfig)


class GenerateContentRequest(CountTokensRequest):
    """The body of generateContent: a prompt, and how to answer it."""

    contents = ListOf(Content, required=True, validate=Length(min=1, error=NOT_EMPTY))
    safetySettings = OptionalField()
    cachedContent = StringField()


class CountTokensBody(ObjectSchema):
    """The body of countTokens: ``contents``, or a whole ``generateContentRequest``."""

    contents = ListOf(Content)
    generateContentRequest = NestedField(CountTokensRequest)

    @validates_schema
    def check_prompt(self, data: dict[str, Any], **kwargs: Any) -> None:
        """Require something to count."""
        if "contents" not in data and "generateContentRequest" not in data:
            raise ValidationError("is required (or generateContentRequest).", "contents")


@dataclass(frozen=True)
class GeminiRequest:
    """A validated request: its model (as the path names it) and the fields this door reads.

    ``config`` is the ``generationConfig``, camelCase.
    """

    model: str
    contents: list[dict[str, Any]]
    system: dict[str, Any] | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_config: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    stream: bool = False


_GENERATE_SCHEMA = GenerateContentRequest()
_COUNT_SCHEMA = CountTokensBody()


def parse_generate_request(body: Any, model: str, *, stream: bool) -> GeminiRequest:
    """Validate a generateContent body; raise InvalidRequest naming the field."""
    return gemini_request(_load_object(_GENERATE_SCHEMA, body), model, stream=stream)


def parse_count_tokens_request(body: Any, model: str) -> GeminiRequest:
    """Validate a countTokens body; raise InvalidRequest naming the field."""
    loaded = _load_object(_COUNT_SCHEMA, body)
    inner = loaded.get("generateContentRequest") or {}
    contents = loaded.get("contents") or inner.get("contents") or []
    return gemini_request({**inner, "contents": contents}, model, stream=False)


def gemini_request(loaded: dict[str, Any], model: str, *, stream: bool) -> GeminiRequest:
    """Return the request of a loaded body."""
    return GeminiRequest(
        model=model,
        contents=loaded.get("contents") or [],
        system=loaded.get("systemInstruction"),
        tools=loaded.get("tools") or [],
        tool_config=(loaded.get("toolConfig") or {}).get("functionCallingConfig") or {},
        config=loaded.get("generationConfig") or {},
        stream=stream,
    )


def _load_object(schema: ObjectSchema, body: Any) -> dict[str, Any]:
    if type(body) is not dict:
        raise InvalidRequest("The request body must be a JSON object.")
    return load_or_raise(schema, camel_keys(body))
