"""Responses items to the normalized chat request, and the core's results to output items.

In: ``instructions`` become the first system message, developer messages system ones;
an earlier answer's text and its function calls one assistant message with tool calls,
each function_call_output a tool message; reasoning items and items of hosted tools
are not shown to the model. Function tools, and a namespace's functions under
``<namespace>__<name>``, become chat tools; ``text.format`` the response_format,
``max_output_tokens`` max_tokens, ``reasoning.effort`` reasoning_effort. Out: reasoning
becomes a reasoning item (its text as the summary), text a message, each tool call a
function_call item (a namespaced one with its namespace), in that order; a streamed
answer's deltas go to an EventWriter as they come.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain
from typing import Any

from app.catalog.registry import Model
from app.errors import InvalidRequest
from app.generations.errors import OutputLimitExceeded, UnsupportedContent
from app.generations.lifecycle import StreamEnd, StreamItem
from app.providers.base import ChatRequest, Chunk, Completion
from app.responses.bodies import (
    COMPLETED,
    INCOMPLETE,
    INCOMPLETE_REASONS,
    EventWriter,
    function_call_item,
    message_item,
    reasoning_item,
    usage_body,
)
from app.responses.ids import ItemIds
from app.responses.schemas import (
    MAX_TOOLS,
    NAMESPACE_SEPARATOR,
    ResponseRequest,
    item_type,
    message_parts,
)

# The content parts whose text a chat model is shown.
TEXT_PARTS = frozenset({"input_text", "output_text", "refusal"})
# Efforts beyond the contract's highest ask for its highest.
EFFORTS = {"xhigh": "high", "max": "high"}
IMAGE_DETAILS = {"original": "high"}


class ToolSet:
    """The function tools a request offers, as chat tools, and the names they go by there."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.chat_tools: list[dict[str, Any]] = []
        # Each chat tool's name: the (namespace, name) the caller knows it by.
        self.names: dict[str, tuple[str | None, str]] = {}
        for tool in tools:
            if tool["type"] == "function":
                self.add(None, tool)
            elif tool["type"] == "namespace":
                for member in tool["tools"]:
                    if member["type"] == "function":
                        self.add(tool["name"], member)
        if len(self.chat_tools) > MAX_TOOLS:
            raise InvalidRequest(f"tools must offer at most {MAX_TOOLS} functions.", param="tools")

    def add(self, namespace: str | None, tool: dict[str, Any]) -> None:
        """Offer one function, under its namespace's name if it has one."""
        name = self.chat_name(tool["name"], namespace)
        if name in self.names:
            raise InvalidRequest(
                f"tools must have unique names; {name!r} is used twice.", param="tools"
            )
        function = {"name": name}
        function.update(
            (key, tool[key]) for key in ("description", "parameters", "strict") if key in tool
        )
        self.chat_tools.append({"type": "function", "function": function})
        self.names[name] = (namespace, tool["name"])

    @staticmethod
    def chat_name(name: str, namespace: str | None) -> str:
        """Return the name a function goes by for a chat model."""
        return name if namespace is None else namespace + NAMESPACE_SEPARATOR + name

    def split(self, chat_name: str) -> tuple[str | None, str]:
        """Return the (namespace, name) a chat model's call of ``chat_name`` is for."""
        return self.names.get(chat_name, (None, chat_name))

    def chosen(self, name: str) -> str:
        """Return the chat name of the function ``tool_choice`` names; refuse others."""
        if name in self.names:
            return name
        members = [chat for chat, (_, plain) in self.names.items() if plain == name]
        if len(members) != 1:
            raise InvalidRequest(
                f"tool_choice names {name!r}, which is not one of the functions offered.",
                param="tool_choice",
            )
        return members[0]


def chat_request(
    request: ResponseRequest, items: list[dict[str, Any]], tools: ToolSet
) -> ChatRequest:
    """Return the normalized request for ``items`` (the conversation so far, oldest first)."""
    messages = []
    if instructions := request.params.get("instructions"):
        messages.append({"role": "system", "content": instructions})
    messages += chat_messages(items, tools)
    if not messages:
        raise InvalidRequest("input is required: there is nothing to answer.", param="input")
    return ChatRequest(
        model=request.model,
        messages=messages,
        params=chat_params(request.params, tools),
        stream=request.stream,
        extra=request.extra,
    )


def chat_params(params: dict[str, Any], tools: ToolSet) -> dict[str, Any]:
    """Return the chat parameters that say what the Responses ones say."""
    chat = {name: params[name] for name in ("temperature", "top_p") if name in params}
    if "max_output_tokens" in params:
        chat["max_tokens"] = params["max_output_tokens"]
    if effort := (params.get("reasoning") or {}).get("effort"):
        chat["reasoning_effort"] = EFFORTS.get(effort, effort)
    text_format = (params.get("text") or {}).get("format")
    if text_format and text_format["type"] != "text":
        chat["response_format"] = response_format(text_format)
    if user := params.get("user") or params.get("safety_identifier"):
        chat["user"] = user
    chat.update(tool_params(params, tools))
    return chat


def response_format(text_format: dict[str, Any]) -> dict[str, Any]:
    """Return the chat response_format of a ``text.format``."""
    if text_format["type"] == "json_object":
        return {"type": "json_object"}
    schema = {
        key: text_format[key]
        for key in ("name", "schema", "strict", "description")
        if key in text_format
    }
    return {"type": "json_schema", "json_schema": schema}


def tool_params(params: dict[str, Any], tools: ToolSet) -> dict[str, Any]:
    """Return tools, tool_choice and parallel_tool_calls; none when no function is offered."""
    offered, choice = tools.chat_tools, params.get("tool_choice")
    if isinstance(choice, dict) and choice["type"] == "allowed_tools":
        allowed = {tools.chosen(tool["name"]) for tool in choice["tools"]}
        offered = [tool for tool in offered if tool["function"]["name"] in allowed]
        choice = choice["mode"]
    elif isinstance(choice, dict):
        choice = {"type": "function", "function": {"name": tools.chosen(choice["name"])}}
    if not offered:
        return {}
    chat: dict[str, Any] = {"tools": offered}
    if choice is not None:
        chat["tool_choice"] = choice
    if "parallel_tool_calls" in params:
        chat["parallel_tool_calls"] = params["parallel_tool_calls"]
    return chat


def chat_messages(items: list[dict[str, Any]], tools: ToolSet) -> list[dict[str, Any]]:
    """Return the chat messages of Responses items; items a model is not shown are left out."""
    messages: list[dict[str, Any]] = []
    for item in items:
        # Items passed through upstream are kept as sent: a message may be untyped, its
        # content a string.
        kind = item_type(item)
        if kind == "message":
            content = message_parts(item["role"], item["content"])
        if kind == "message" and item["role"] == "assistant":
            add_to_answer(messages, content=answer_text(content))
        elif kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": chat_content(content)})
        elif kind == "function_call":
            name = tools.chat_name(item["name"], item.get("namespace"))
            call = {"name": name, "arguments": item["arguments"]}
            add_to_answer(
                messages, call={"id": item["call_id"], "type": "function", "function": call}
            )
        elif kind == "function_call_output":
            output = item["output"]
            content = output if isinstance(output, str) else chat_content(output)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
    return messages


def add_to_answer(
    messages: list[dict[str, Any]], *, content: str | None = None, call: dict | None = None
) -> None:
    """Add text or a tool call to the assistant message last said, or to a new one."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": None})
    answer = messages[-1]
    if content is not None:
        answer["content"] = (answer["content"] or "") + content
    if call is not None:
        answer.setdefault("tool_calls", []).append(call)


def answer_text(parts: list[dict[str, Any]]) -> str:
    """Join an earlier answer's text and refusal parts."""
    return "".join(part.get("text") or part.get("refusal") or "" for part in parts)


def chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Return parts as chat content: one text part as its text, else text and image parts."""
    if not parts:
        return ""
    if len(parts) == 1 and parts[0]["type"] in TEXT_PARTS:
        return answer_text(parts)
    return [chat_part(part) for part in parts]


def chat_part(part: dict[str, Any]) -> dict[str, Any]:
    """Return one part as a chat content part; refuse a part a chat model cannot be shown.

    :raise UnsupportedContent: a file, a recording, an image by file id, a new type.
    """
    kind = part["type"]
    if kind == "input_image" and "image_url" in part:
        detail = part.get("detail") or "auto"
        detail = IMAGE_DETAILS.get(detail, detail)
        return {"type": "image_url", "image_url": {"url": part["image_url"], "detail": detail}}
    if kind in TEXT_PARTS:
        return {"type": "text", "text": part.get("text") or part.get("refusal") or ""}
    shown = "an image by file_id" if kind == "input_image" else f"a part of type {kind!r}"
    raise UnsupportedContent(
        f"The input holds {shown[:80]}, which this model cannot be shown: only text and "
        "images by URL or data: URI are translated. Models whose route passes requests "
        "through take what their upstream accepts."
    )


def output_items(
    completion: Completion, tools: ToolSet, ids: ItemIds
) -> tuple[list[dict[str, Any]], str | None]:
    """Return a whole answer's output items, and why it is incomplete (None: it is not)."""
    choice = completion.choices[0] if completion.choices else {}
    message = choice.get("message") or {}
    reason = INCOMPLETE_REASONS.get(choice.get("finish_reason") or "")
    items = []
    if message.get("reasoning"):
        items.append(reasoning_item(ids.next("rs"), message["reasoning"]))
    text = message.get("content") or message.get("refusal")
    calls = message.get("tool_calls") or ()
    if text or not calls:
        items.append(message_item(ids.next("msg"), text or "", INCOMPLETE if reason else COMPLETED))
    for call in calls:
        function = call.get("function") or {}
        namespace, name = tools.split(function.get("name") or "")
        call_id = call.get("id") or ""
        items.append(
            function_call_item(
                ids.next("fc"), call_id, name, function.get("arguments") or "", namespace
            )
        )
    return items, reason


class StreamTranslation:
    """Hands a chat stream's deltas to an EventWriter, one output item at a time.

    Reasoning, text and tool calls go out as they come. A tool call's item stays open
    until the answer turns to something else or ends: chat streams may interleave the
    arguments of parallel calls, so a call that starts meanwhile waits, its arguments
    gathered, and goes out whole when the open one is done.
    """

    def __init__(self, writer: EventWriter, tools: ToolSet) -> None:
        self.writer = writer
        self.tools = tools
        self.current: int | None = None
        self.waiting: dict[int, dict[str, Any]] = {}
        self.done: set[int] = set()

    def read(self, chunk: Chunk) -> None:
        """Deliver what a chunk's first choice brings."""
        for choice in chunk.choices:
            delta = choice.get("delta")
            if not delta or choice.get("index", 0) != 0:
                continue
            if len(delta) == 1 and "content" in delta and self.current is None:
                # Most chunks carry a token of text alone.
                if delta["content"]:
                    self.writer.text(delta["content"])
                continue
            if reasoning := delta.get("reasoning"):
                self.settle_calls()
                self.writer.reasoning(reasoning)
            if text := delta.get("content") or delta.get("refusal"):
                self.settle_calls()
                self.writer.text(text)
            for call in delta.get("tool_calls") or ():
                self.read_call(call)

    def read_call(self, call: dict[str, Any]) -> None:
        """Deliver a piece of a tool call, or keep it while another call's item is open."""
        index = call.get("index", 0)
        function = call.get("function") or {}
        piece = function.get("arguments") or ""
        if index == self.current:
            if piece:
                self.writer.arguments(piece)
        elif index in self.done:
            return
        elif self.current is None and not self.waiting:
            self.open_call(index, call.get("id"), function.get("name"))
            if piece:
                self.writer.arguments(piece)
        else:
            waiting = self.waiting.setdefault(index, {"id": None, "name": None, "pieces": []})
            waiting["id"] = waiting["id"] or call.get("id")
            waiting["name"] = waiting["name"] or function.get("name")
            waiting["pieces"].append(piece)

    def open_call(self, index: int, call_id: str | None, chat_name: str | None) -> None:
        """Open the item of the call at ``index``."""
        namespace, name = self.tools.split(chat_name or "")
        self.writer.call(call_id or "", name, namespace)
        self.current = index
        self.done.add(index)

    def settle_calls(self) -> None:
        """Close the open call, then send every waiting call whole."""
        if self.current is None:
            return
        self.writer.close()
        for index, call in self.waiting.items():
            self.open_call(index, call["id"], call["name"])
            if arguments := "".join(call["pieces"]):
                self.writer.arguments(arguments)
            self.writer.close()
        self.current = None
        self.waiting.clear()


def response_events(
    writer: EventWriter,
    translation: StreamTranslation,
    items: Iterator[StreamItem],
    finished: Callable[[dict[str, Any]], None],
) -> Iterator[list[dict[str, Any]] | None]:
    """Yield a streamed response's events, each chunk's in a list; the core's Nones pass.

    Nothing is yielded before the core's first item, so that a failure before it is
    answered with a status. ``finished`` is given the finished Response before its last
    event goes out (to store it). Closing this closes ``items``.
    """
    try:
        first = next((item for item in items if item is not None), None)
        if first is None:
            return
        writer.start()
        for item in chain((first,), items):
            if item is None:
                yield None
                continue
            if isinstance(item, StreamEnd):
                writer.terminal(end_of_stream(writer, translation, item, finished))
            else:
                translation.read(item)
            if writer.events:
                # The events of one chunk go out together, framed in one piece.
                events, writer.events = writer.events, []
                yield events
    finally:
        items.close()


def end_of_stream(
    writer: EventWriter,
    translation: StreamTranslation,
    end: StreamEnd,
    finished: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Close the stream's last items and return the finished Response, handed to ``finished``."""
    translation.settle_calls()
    response = writer.finish(usage_body(end.usage, end.cost), end.finish_reason)
    finished(response)
    return response


def check_output_limit(request: ResponseRequest, model: Model) -> None:
    """Refuse a ``max_output_tokens`` beyond what the model produces, by the caller's name."""
    asked = request.params.get("max_output_tokens")
    if asked is not None and asked > model.max_output_tokens:
        raise OutputLimitExceeded(
            f"max_output_tokens is too large: {asked}. Model '{model.id}' produces at most "
            f"{model.max_output_tokens} output tokens.",
            param="max_output_tokens",
        )
