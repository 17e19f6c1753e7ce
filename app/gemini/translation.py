"""Gemini requests to the normalized chat request, and the core's results to Google's terms.

In: ``systemInstruction`` becomes the first system message; a ``user`` turn's text and
images one user message, each ``functionResponse`` in it a tool message; a ``model``
turn's text and ``functionCall`` parts one assistant message with tool calls. Thoughts
are not sent back (a model of another family cannot read them, and their signatures are
Google's). Calls without an id (Google's API gives none) get one, which their results
(matched by name, in order) reuse. ``functionDeclarations`` become function tools, their
Google Schemas JSON Schemas; ``toolConfig`` becomes ``tool_choice``; ``generationConfig``
maps onto chat's sampling parameters, ``responseMimeType`` and the schemas onto
``response_format``, ``thinkingConfig`` onto the reasoning effort.

Out: reasoning becomes a thought part (only when ``includeThoughts`` asks for them, as
Google's API does), text a text part, each tool call a ``functionCall`` part; finish
reasons become Google's. A streamed answer is one GenerateContentResponse per chunk, the
last one with the usage and its cost.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterator
from typing import Any

from app.catalog.registry import Model
from app.encoding import dumps, loads
from app.errors import InvalidRequest
from app.gemini.bodies import candidate, response_body, usage_metadata
from app.gemini.schemas import GeminiRequest, camel
from app.generations.lifecycle import Answer, Generation, StreamEnd, StreamItem
from app.providers.base import ChatRequest, Chunk

FINISH_REASONS = {
    "stop": "STOP",
    "length": "MAX_TOKENS",
    "tool_calls": "STOP",
    "function_call": "STOP",
    "content_filter": "SAFETY",
}
MODES = {"AUTO": "auto", "VALIDATED": "auto", "ANY": "required", "NONE": "none"}
LEVELS = {"MINIMAL": "minimal", "LOW": "low", "MEDIUM": "medium", "HIGH": "high"}
# Thinking budgets (tokens) below which a budget reads as a low, then a medium effort.
LOW_BUDGET, MEDIUM_BUDGET = 4096, 16384
SAMPLING = {
    "temperature": "temperature",
    "topP": "top_p",
    "seed": "seed",
    "presencePenalty": "presence_penalty",
    "frequencyPenalty": "frequency_penalty",
}
JSON_MIME = "application/json"
# Google Schema's keys that JSON Schema has not (property order is a hint to Gemini).
SCHEMA_HINTS = frozenset({"propertyOrdering", "nullable"})


def chat_request(request: GeminiRequest, model: Model) -> ChatRequest:
    """Return the normalized request for a Gemini request to ``model``."""
    config = request.config
    params = {SAMPLING[name]: config[name] for name in SAMPLING if name in config}
    if config.get("stopSequences"):
        params["stop"] = config["stopSequences"]
    if (count := config.get("candidateCount", 1)) > 1:
        params["n"] = count
    if "maxOutputTokens" in config:
        # Google's clients ask for the largest output their models take (Gemini CLI
        # 65536): the cap is read as the cap it is, clamped to the model's.
        params["max_tokens"] = min(config["maxOutputTokens"], model.max_output_tokens)
    if (response_format := response_format_of(config)) is not None:
        params["response_format"] = response_format
    if "reasoning" in model.capabilities and (effort := reasoning_effort(config)) is not None:
        params["reasoning_effort"] = effort
    params.update(tool_params(request))
    extra = {"top_k": int(config["topK"])} if "topK" in config else {}
    messages = chat_messages(request)
    if all(message["role"] == "system" for message in messages):
        raise InvalidRequest(
            "contents must hold a user or model turn with something to answer.",
            param="contents",
        )
    return ChatRequest(
        model=request.model, messages=messages, params=params, stream=request.stream, extra=extra
    )


def response_format_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """Return the chat response format of ``responseMimeType`` and the response schemas."""
    schema = config.get("responseJsonSchema")
    if schema is None and "responseSchema" in config:
        schema = json_schema(config["responseSchema"])
    if schema is not None:
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    if config.get("responseMimeType") == JSON_MIME:
        return {"type": "json_object"}
    return None


def reasoning_effort(config: dict[str, Any]) -> str | None:
    """Return the reasoning effort ``thinkingConfig`` asks for; None leaves the model's."""
    thinking = config.get("thinkingConfig") or {}
    if level := LEVELS.get(thinking.get("thinkingLevel", "")):
        return level
    budget = thinking.get("thinkingBudget")
    if budget is None or budget < 0:
        return None
    if budget == 0:
        return "none"
    return "low" if budget < LOW_BUDGET else "medium" if budget < MEDIUM_BUDGET else "high"


def json_schema(schema: Any) -> Any:
    """Return a Google Schema as JSON Schema: types in lower case, ``nullable`` a type."""
    if type(schema) is not dict:
        return schema
    converted: dict[str, Any] = {}
    for name, value in schema.items():
        # A schema's keys are keywords (its properties' names are a level down): Google
        # takes them in snake_case too.
        key = camel(name)
        if key in SCHEMA_HINTS:
            continue
        if key == "type" and type(value) is str:
            converted[key] = value.lower()
        elif key == "properties" and type(value) is dict:
            converted[key] = {name: json_schema(item) for name, item in value.items()}
        elif key in ("items", "anyOf") and type(value) in (dict, list):
            converted["items" if key == "items" else "anyOf"] = (
                [json_schema(item) for item in value] if type(value) is list
                else json_schema(value)
            )  # fmt: skip
        else:
            converted[key] = value
    if schema.get("nullable") is True and type(converted.get("type")) is str:
        converted["type"] = [converted["type"], "null"]
    return converted


def function_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the function tools of the declarations; hosted tools are not offered."""
    offered = []
    for tool in tools:
        for declaration in tool.get("functionDeclarations") or ():
            parameters = declaration.get("parametersJsonSchema")
            if parameters is None:
                parameters = json_schema(declaration.get("parameters") or {"type": "OBJECT"})
            function = {"name": declaration["name"], "parameters": parameters}
            if "description" in declaration:
                function["description"] = declaration["description"]
            offered.append({"type": "function", "function": function})
    return offered


def tool_params(request: GeminiRequest) -> dict[str, Any]:
    """Return chat's tools and tool_choice; none when no function is declared."""
    tools = function_tools(request.tools)
    if not tools:
        return {}
    params: dict[str, Any] = {"tools": tools}
    mode = request.tool_config.get("mode", "AUTO")
    allowed = request.tool_config.get("allowedFunctionNames") or []
    if mode == "ANY" and len(allowed) == 1:
        check_declared(allowed[0], tools)
        params["tool_choice"] = {"type": "function", "function": {"name": allowed[0]}}
    elif mode in MODES:
        params["tool_choice"] = MODES[mode]
    return params


def check_declared(name: str, tools: list[dict[str, Any]]) -> None:
    """Refuse an allowed function name that no declaration names."""
    if name not in {tool["function"]["name"] for tool in tools}:
        raise InvalidRequest(
            f"toolConfig.functionCallingConfig.allowedFunctionNames names {name!r}, which "
            "is not a declared function.",
            param="toolConfig.functionCallingConfig.allowedFunctionNames",
        )


def chat_messages(request: GeminiRequest) -> list[dict[str, Any]]:
    """Return the conversation as chat messages, the system instruction first."""
    chat = []
    if request.system and (text := joined_text(request.system["parts"])):
        chat.append({"role": "system", "content": text})
    calls = CallIds()
    for index, content in enumerate(request.contents):
        where = f"contents[{index}]"
        role = content.get("role") or "user"
        if role == "model":
            chat += model_messages(content["parts"], calls, index)
        elif role == "system":
            if text := joined_text(content["parts"]):
                chat.append({"role": "system", "content": text})
        else:
            chat += user_messages(content["parts"], calls, where)
    return chat


def joined_text(parts: list[dict[str, Any]]) -> str:
    """Return the text of parts that are not thoughts, a paragraph apart."""
    return "\n\n".join(part["text"] for part in parts if "text" in part and not part.get("thought"))


class CallIds:
    """The ids of a conversation's function calls, which results without an id reuse.

    Google's API names calls by function name alone; chat needs an id on each call and
    its result. A result takes the earliest call of its name still unanswered.
    """

    def __init__(self) -> None:
        self.pending: dict[str, deque[str]] = defaultdict(deque)
        self.made = 0

    def of_call(self, call: dict[str, Any], turn: int, index: int) -> str:
        """Return the id of a call, made up when it has none; it awaits its result."""
        call_id = call.get("id") or f"call_{turn}_{index}"
        self.pending[call["name"]].append(call_id)
        return call_id

    def of_result(self, result: dict[str, Any]) -> str:
        """Return the id of the call a result answers."""
        waiting = self.pending[result["name"]]
        if result.get("id"):
            if result["id"] in waiting:
                waiting.remove(result["id"])
            return result["id"]
        self.made += 1
        return waiting.popleft() if waiting else f"call_result_{self.made}"


def model_messages(parts: list[dict[str, Any]], calls: CallIds, turn: int) -> list[dict[str, Any]]:
    """Return a model turn's text and function calls as one message; thoughts are left out."""
    text = "".join(part["text"] for part in parts if "text" in part and not part.get("thought"))
    tool_calls = [
        {
            "id": calls.of_call(part["functionCall"], turn, index),
            "type": "function",
            "function": {
                "name": part["functionCall"]["name"],
                "arguments": dumps(part["functionCall"].get("args") or {}).decode(),
            },
        }
        for index, part in enumerate(parts)
        if "functionCall" in part
    ]
    if not text and not tool_calls:
        return []
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return [message]


def user_messages(parts: list[dict[str, Any]], calls: CallIds, where: str) -> list[dict[str, Any]]:
    """Return a user turn: a tool message per function result, then one message of the rest."""
    tools, content = [], []
    for index, part in enumerate(parts):
        if "functionResponse" in part:
            result = part["functionResponse"]
            tools.append({
                "role": "tool",
                "tool_call_id": calls.of_result(result),
                "content": dumps(result.get("response") or {}).decode(),
            })  # fmt: skip
        else:
            content += content_parts(part, f"{where}.parts[{index}]")
    return tools + ([{"role": "user", "content": content}] if content else [])


def content_parts(part: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Return the chat content parts of a user's part (none for thoughts and unknown parts)."""
    if "text" in part and not part.get("thought"):
        return [{"type": "text", "text": part["text"]}]
    if "inlineData" in part:
        blob = part["inlineData"]
        check_image(blob["mimeType"], f"{where}.inlineData")
        url = f"data:{blob['mimeType']};base64,{blob['data']}"
        return [{"type": "image_url", "image_url": {"url": url}}]
    if "fileData" in part:
        data = part["fileData"]
        check_image(data.get("mimeType") or "", f"{where}.fileData")
        return [{"type": "image_url", "image_url": {"url": data["fileUri"]}}]
    return []


def check_image(mime_type: str, where: str) -> None:
    """Refuse data other than an image: a translated route's model is shown images only."""
    if not mime_type.startswith("image/"):
        raise InvalidRequest(
            f"{where}.mimeType is {mime_type!r}: only images (image/*) can be shown to this model.",
            param=f"{where}.mimeType",
        )


def finish_reason_of(finish_reason: str | None) -> str:
    """Return Google's finish reason for a chat one."""
    return FINISH_REASONS.get(finish_reason or "stop", "OTHER")


def thoughts_shown(request: GeminiRequest) -> bool:
    """Tell whether the caller asked for thought parts (Google's API sends none unless asked)."""
    return bool((request.config.get("thinkingConfig") or {}).get("includeThoughts"))


def function_call_part(call: dict[str, Any]) -> dict[str, Any]:
    """Return the ``functionCall`` part of a chat tool call; unreadable arguments give ``{}``.

    Arguments cut short by the output limit are not JSON; the finish reason says why.
    """
    function = call.get("function") or {}
    try:
        arguments = loads(function.get("arguments") or "{}")
    except ValueError:
        arguments = {}
    args = arguments if type(arguments) is dict else {}
    body: dict[str, Any] = {"name": function.get("name") or "", "args": args}
    if call.get("id"):
        body["id"] = call["id"]
    return {"functionCall": body}


def answer_text(content: Any) -> str:
    """Return an answer's text: a string, or the text of the parts some upstreams send."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(part.get("text") or "" for part in content if isinstance(part, dict))


def answer_parts(message: dict[str, Any], thoughts: bool) -> list[dict[str, Any]]:
    """Return an answer's parts: its thought, text, then function calls."""
    parts = []
    if thoughts and (reasoning := message.get("reasoning")):
        parts.append({"text": reasoning, "thought": True})
    if text := answer_text(message.get("content")) or answer_text(message.get("refusal")):
        parts.append({"text": text})
    return parts + [function_call_part(call) for call in message.get("tool_calls") or ()]


def response_of(generation: Generation, answer: Answer, *, thoughts: bool) -> dict[str, Any]:
    """Return the GenerateContentResponse a whole generation answers with, its cost in usage."""
    candidates = [
        candidate(
            answer_parts(choice.get("message") or {}, thoughts),
            finish_reason_of(choice.get("finish_reason")),
            choice.get("index", position),
        )
        for position, choice in enumerate(answer.completion.choices)
    ]
    return response_body(
        response_id=generation.id,
        model=generation.model.id,
        candidates=candidates,
        usage=usage_metadata(answer.completion.usage, answer.cost),
    )


class StreamTranslation:
    """Turns a generation's stream into GenerateContentResponses, one per chunk.

    Google streams each candidate's new parts, a function call whole in one part: a
    call's arguments are gathered until its choice finishes.
    """

    def __init__(self, generation: Generation, *, thoughts: bool) -> None:
        self.generation = generation
        self.thoughts = thoughts
        # The calls being streamed, by choice then by chat index: their id, name, arguments.
        self.calls: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
        # Each choice's chat finish reason, once it came.
        self.finishes: dict[int, str] = {}

    def events(self, items: Iterator[StreamItem]) -> Iterator[dict[str, Any] | None]:
        """Yield the responses of ``items``; the Nones pass through. Closing this closes them."""
        try:
            for item in items:
                if item is None:
                    yield None
                elif isinstance(item, StreamEnd):
                    yield self.end(item)
                elif candidates := self.candidates(item):
                    yield self.response(candidates)
        finally:
            items.close()

    def response(self, candidates: list[dict[str, Any]], usage: Any = None) -> dict[str, Any]:
        """Return one event's GenerateContentResponse."""
        return response_body(
            response_id=self.generation.id,
            model=self.generation.model.id,
            candidates=candidates,
            usage=usage,
        )

    def candidates(self, chunk: Chunk) -> list[dict[str, Any]]:
        """Return the candidates of one chunk's deltas that have parts.

        A choice's finish waits for the last response, which carries the usage beside it,
        as Google's last response does.
        """
        candidates = []
        for choice in chunk.choices:
            index = choice.get("index", 0)
            delta = choice.get("delta") or {}
            parts = []
            if self.thoughts and isinstance(delta.get("reasoning"), str) and delta["reasoning"]:
                parts.append({"text": delta["reasoning"], "thought": True})
            if isinstance(delta.get("content"), str) and delta["content"]:
                parts.append({"text": delta["content"]})
            for call in delta.get("tool_calls") or ():
                self.gather(index, call)
            if finish := choice.get("finish_reason"):
                self.finishes[index] = finish
                parts += self.finished_calls(index)
            if parts:
                candidates.append(candidate(parts, None, index))
        return candidates

    def gather(self, index: int, call: dict[str, Any]) -> None:
        """Add a streamed piece of a tool call to its call."""
        function = call.get("function") or {}
        gathered = self.calls[index].setdefault(
            call.get("index", 0), {"id": None, "name": "", "arguments": []}
        )
        gathered["id"] = gathered["id"] or call.get("id")
        gathered["name"] = gathered["name"] or function.get("name") or ""
        if function.get("arguments"):
            gathered["arguments"].append(function["arguments"])

    def finished_calls(self, index: int) -> list[dict[str, Any]]:
        """Return the ``functionCall`` parts of a finished choice's calls."""
        calls = self.calls.pop(index, {})
        return [
            function_call_part(
                {
                    "id": call["id"],
                    "function": {"name": call["name"], "arguments": "".join(call["arguments"])},
                }
            )  # fmt: skip
            for _, call in sorted(calls.items())
        ]

    def end(self, end: StreamEnd) -> dict[str, Any]:
        """Return the last response: each candidate's finish, the whole usage and its cost.

        Calls whose choice never said it finished go out here, whole.
        """
        indexes = sorted(set(self.finishes) | set(self.calls)) or [0]
        candidates = [
            candidate(
                self.finished_calls(index),
                finish_reason_of(self.finishes.get(index) or end.finish_reason),
                index,
            )
            for index in indexes
        ]
        return self.response(candidates, usage_metadata(end.usage, end.cost))
