"""Messages requests to the normalized chat request, and the core's results to Anthropic's terms.

In: ``system`` becomes the first system message and a ``system`` turn inside ``messages``
a system message where it stands (an instruction, never a user's words); an assistant
turn's text and ``tool_use`` blocks become one assistant message with tool calls, each
``tool_result`` a tool message, a user turn's text, images and text documents one user
message; thinking blocks are not sent back (a non-Anthropic model cannot read them).
Tools defined by an ``input_schema`` become function tools; versioned tools (server
tools, and client tools whose schema only Anthropic's models know) and deferred ones
are not offered. ``tool_choice`` maps onto chat's, ``disable_parallel_tool_use`` onto
``parallel_tool_calls``, ``thinking`` and ``output_config.effort`` onto the reasoning
effort, ``stop_sequences`` onto ``stop``, ``metadata.user_id`` onto ``user``, ``top_k``
onto the extra field of that name.

Out: reasoning becomes a thinking block (signed by the upstream, or by the gateway when
the upstream does not sign), text a text block, each tool call a ``tool_use`` block, in
that order; finish reasons become stop reasons. A streamed answer's deltas become
content blocks opened and closed one after the other, as the SDKs' accumulators need.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Iterator
from typing import Any

from app.catalog.registry import Model
from app.encoding import dumps, loads
from app.errors import InvalidRequest
from app.generations.lifecycle import Answer, Generation, StreamEnd, StreamItem
from app.messages.bodies import (
    MESSAGE_STOP,
    PING,
    block_delta,
    block_start,
    block_stop,
    message_body,
    message_delta,
    message_start,
    new_tool_use_id,
    usage_body,
)
from app.messages.schemas import CUSTOM_TOOL, MessagesRequest
from app.providers.base import ChatRequest, Chunk, Usage

log = logging.getLogger(__name__)

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
# Anthropic's efforts beyond the normalized request's highest ask for its highest.
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
# Thinking budgets (tokens) below which a budget reads as a low, then a medium effort.
LOW_BUDGET, MEDIUM_BUDGET = 4096, 16384
SIGNATURE_PREFIX = b"gateway-thinking-v1:"
TEXT_DOCUMENTS = ("text", "content")


def chat_request(request: MessagesRequest, model: Model) -> ChatRequest:
    """Return the normalized request for a Messages request to ``model``."""
    params = request.params
    chat_params = sampling_params(params)
    # Claude Code asks every model for thinking at some effort: an OpenAI-compatible
    # upstream refuses reasoning_effort for a model that does not reason.
    if "reasoning" in model.capabilities and (effort := reasoning_effort(params)) is not None:
        chat_params["reasoning_effort"] = effort
    if request.max_tokens is not None:
        # Claude Code asks for 32000 output tokens (128000 for some models) whatever the
        # model, and cannot be told the gateway's models' limits: refused, it retries
        # and fails, so a user pointing it at the built-in models (4096) gets nothing.
        # A Messages max_tokens is read as the cap it is, clamped to the model's; an
        # answer that reaches it still says so with stop_reason max_tokens.
        chat_params["max_tokens"] = min(request.max_tokens, model.max_output_tokens)
    chat_params.update(tool_params(params))
    extra = dict(request.extra)
    if "top_k" in params:
        extra["top_k"] = params["top_k"]
    messages = chat_messages(params.get("system"), request.messages)
    if all(message["role"] == "system" for message in messages):
        raise InvalidRequest(
            "messages must hold a user or assistant turn with something to answer.",
            param="messages",
        )
    return ChatRequest(
        model=request.model,
        messages=messages,
        params=chat_params,
        stream=request.stream,
        extra=extra,
    )


def sampling_params(params: dict[str, Any]) -> dict[str, Any]:
    """Return the chat parameters for sampling, stops, the end user and the output format."""
    chat = {name: params[name] for name in ("temperature", "top_p") if name in params}
    if params.get("stop_sequences"):
        chat["stop"] = params["stop_sequences"]
    if user := (params.get("metadata") or {}).get("user_id"):
        chat["user"] = user
    output_format = (params.get("output_config") or {}).get("format")
    if output_format is not None:
        schema = {"name": "output", "schema": output_format["schema"]}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    return chat


def reasoning_effort(params: dict[str, Any]) -> str | None:
    """Return the reasoning effort ``thinking`` and ``output_config.effort`` ask for.

    None leaves the model's default: the request said nothing of thinking.
    """
    thinking = params.get("thinking") or {}
    if thinking.get("type") == "disabled":
        return "none"
    if effort := (params.get("output_config") or {}).get("effort"):
        return EFFORTS[effort]
    if thinking.get("type") == "enabled":
        budget = thinking["budget_tokens"]
        return "low" if budget < LOW_BUDGET else "medium" if budget < MEDIUM_BUDGET else "high"
    return "medium" if thinking.get("type") == "adaptive" else None


def offered_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the function tools for the tools a translated route can run."""
    offered = []
    for tool in tools:
        if tool.get("type", CUSTOM_TOOL) != CUSTOM_TOOL or tool.get("defer_loading"):
            continue
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if "description" in tool:
            function["description"] = tool["description"]
        offered.append({"type": "function", "function": function})
    return offered


def tool_params(params: dict[str, Any]) -> dict[str, Any]:
    """Return chat's tools, tool_choice and parallel_tool_calls; none if no tool is offered."""
    tools = offered_tools(params.get("tools") or ())
    choice = params.get("tool_choice")
    if choice is not None and choice["type"] == "tool":
        check_offered(choice["name"], tools)
    if not tools:
        return {}
    chat: dict[str, Any] = {"tools": tools}
    if choice is None:
        return chat
    if choice["type"] == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice["type"]]
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False
    return chat


def check_offered(name: str, tools: list[dict[str, Any]]) -> None:
    """Refuse a tool_choice that forces a tool the model is not offered."""
    if name not in {tool["function"]["name"] for tool in tools}:
        raise InvalidRequest(
            f"tool_choice.name names {name!r}, which is not one of the tools this model can "
            "be offered.",
            param="tool_choice.name",
        )


def chat_messages(
    system: str | list[dict[str, Any]] | None, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Return the conversation as chat messages, the system prompt first."""
    chat = []
    if system and (text := joined_text(system)):
        chat.append({"role": "system", "content": text})
    for index, message in enumerate(messages):
        chat += turn_messages(message, f"messages[{index}]")
    return chat


def joined_text(content: str | list[dict[str, Any]]) -> str:
    """Return the text of a string or of text blocks, blocks a paragraph apart."""
    if isinstance(content, str):
        return content
    return "\n\n".join(block["text"] for block in content if block.get("type") == "text")


def turn_messages(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Return the chat messages one turn becomes (none for a turn with nothing to show)."""
    role, content = message["role"], message["content"]
    if role == "system":
        text = joined_text(content)
        return [{"role": "system", "content": text}] if text else []
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        return assistant_messages(content)
    return user_messages(content, where)


def assistant_messages(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return an assistant turn's text and tool calls as one message; thinking is left out."""
    text = "".join(block["text"] for block in blocks if block["type"] == "text")
    calls = [tool_call_of(block) for block in blocks if block["type"] == "tool_use"]
    if not text and not calls:
        return []
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def tool_call_of(block: dict[str, Any]) -> dict[str, Any]:
    """Return the chat tool call of a ``tool_use`` block."""
    arguments = dumps(block["input"]).decode()
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": arguments},
    }


def user_messages(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Return a user turn: a tool message per result, then one message of the rest.

    Chat wants tool results right after the call's message, as Anthropic wants them first
    in the turn.
    """
    tools, parts = [], []
    for index, block in enumerate(blocks):
        if block["type"] == "tool_result":
            content = tool_result_content(block.get("content"), f"{where}.content[{index}]")
            tools.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": content})
        else:
            parts += content_parts(block, f"{where}.content[{index}]")
    return tools + ([{"role": "user", "content": parts}] if parts else [])


def tool_result_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """Return a tool result's content: its text, or its parts when it holds images."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = [
        part
        for index, block in enumerate(content)
        for part in content_parts(block, f"{where}.content[{index}]")
    ]
    if all(part["type"] == "text" for part in parts):
        return "\n\n".join(part["text"] for part in parts)
    return parts


def content_parts(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Return the chat content parts of a user's block (none for blocks not shown)."""
    kind = block["type"]
    if kind == "text":
        return [{"type": "text", "text": block["text"]}]
    if kind == "image":
        return [{"type": "image_url", "image_url": {"url": image_url(block["source"])}}]
    if kind == "document":
        return document_parts(block, where)
    return []


def image_url(source: dict[str, Any]) -> str:
    """Return an image source as a URL: its own, or a base64 ``data:`` URI."""
    if source["type"] == "url":
        return source["url"]
    return f"data:{source['media_type']};base64,{source['data']}"


def document_parts(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Return a text document's parts; a PDF cannot be shown to a translated route's model."""
    source = block["source"]
    if source["type"] not in TEXT_DOCUMENTS:
        raise InvalidRequest(
            f"{where} is a {source['type']} document, which only plain-text documents "
            "can stand for on this model.",
            param=where,
        )
    content = source.get("data") if source["type"] == "text" else source.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [
        {"type": "text", "text": item["text"]}
        for item in content or ()
        if isinstance(item, dict) and isinstance(item.get("text"), str)
    ]


def stop_reason_of(finish_reason: str | None, stop_sequence: str | None = None) -> str:
    """Return the stop reason a chat finish reason stands for, ended on ``stop_sequence``."""
    if stop_sequence is not None and (finish_reason or "stop") == "stop":
        return "stop_sequence"
    return STOP_REASONS.get(finish_reason or "stop", "end_turn")


def named_stop(stop_reason: str, stop_sequence: str | None) -> str | None:
    """Return the stop sequence an answer names: the one it ended on, else none."""
    return stop_sequence if stop_reason == "stop_sequence" else None


def signature_of(thinking: str) -> str:
    """Return the gateway's signature of a thinking text its upstream did not sign.

    Clients send thinking back with its signature, which must not be empty; a translated
    route never reads it back (thinking is not sent to a non-Anthropic model).
    """
    digest = hashlib.sha256(thinking.encode()).digest()
    return base64.b64encode(SIGNATURE_PREFIX + digest).decode()


def thinking_omitted(request: MessagesRequest) -> bool:
    """Tell whether the caller asked for thinking blocks without their text."""
    return (request.params.get("thinking") or {}).get("display") == "omitted"


def thinking_blocks(message: dict[str, Any], omitted: bool) -> list[dict[str, Any]]:
    """Return the thinking and redacted thinking blocks of an answer's reasoning."""
    details = message.get("reasoning_details") or []
    if not details and message.get("reasoning"):
        details = [{"type": "reasoning.text", "text": message["reasoning"]}]
    blocks = []
    for detail in details:
        if detail.get("type") == "reasoning.encrypted" and detail.get("data"):
            blocks.append({"type": "redacted_thinking", "data": detail["data"]})
        elif detail.get("type") == "reasoning.text":
            text = detail.get("text") or ""
            signature = detail.get("signature") or signature_of(text)
            thinking = "" if omitted else text
            blocks.append({"type": "thinking", "thinking": thinking, "signature": signature})
    return blocks


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    """Return the ``tool_use`` block of a chat tool call; unreadable arguments give ``{}``.

    Arguments cut short by the output limit are not JSON; the stop reason says why.
    """
    function = call.get("function") or {}
    try:
        arguments = loads(function.get("arguments") or "{}")
    except ValueError:
        arguments = {}
    return {
        "type": "tool_use",
        # Clients send the id back with the call's result: it must not be empty.
        "id": call.get("id") or new_tool_use_id(),
        "name": function.get("name") or "",
        "input": arguments if isinstance(arguments, dict) else {},
    }


def answer_text(content: Any) -> str:
    """Return an answer's text: a string, or the text of the parts some upstreams send."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(part.get("text") or "" for part in content if isinstance(part, dict))


def answer_content(message: dict[str, Any], omitted: bool) -> list[dict[str, Any]]:
    """Return an answer's content blocks: thinking, text, then tool uses."""
    blocks = thinking_blocks(message, omitted)
    if text := answer_text(message.get("content")) or answer_text(message.get("refusal")):
        blocks.append({"type": "text", "text": text})
    blocks += [tool_use_block(call) for call in message.get("tool_calls") or ()]
    return blocks


def message_of(generation: Generation, answer: Answer, *, omitted: bool) -> dict[str, Any]:
    """Return the Message a whole generation answers with, its cost in its usage."""
    choices = answer.completion.choices
    choice = choices[0] if choices else {"message": {}, "finish_reason": None}
    stop_sequence = answer.completion.stop_sequence
    stop_reason = stop_reason_of(choice.get("finish_reason"), stop_sequence)
    return message_body(
        message_id=generation.id,
        model=generation.model.id,
        content=answer_content(choice["message"], omitted),
        stop_reason=stop_reason,
        usage=usage_body(answer.completion.usage, answer.cost),
        stop_sequence=named_stop(stop_reason, stop_sequence),
    )


def starting_usage(generation: Generation) -> Usage:
    """Return the usage a stream starts with: the prompt, when it was counted exactly."""
    return Usage(prompt_tokens=generation.prompt_tokens if generation.prompt_tokens_exact else 0)


class StreamTranslation:
    """Turns a generation's stream into Anthropic's events, one content block at a time.

    A chat delta can carry reasoning, text and tool-call pieces in any order; each kind
    opens its own block when it changes, closing the one before, since the SDKs read a
    delta as belonging to the last block opened.
    """

    def __init__(self, generation: Generation, *, omitted: bool) -> None:
        self.generation = generation
        self.omitted = omitted
        self.index = -1
        self.open: str | None = None
        # The block index of each tool call, by its chat index.
        self.calls: dict[int, int] = {}
        self.thinking: list[str] = []
        self.signature: str | None = None
        self.stop_reason: str | None = None
        # The caller's stop sequence the answer ended on, when its upstream said which.
        self.stop_sequence: str | None = None

    def events(self, items: Iterator[StreamItem]) -> Iterator[dict[str, Any] | None]:
        """Yield the events of ``items``; the Nones pass through. Closing this closes them.

        ``message_start`` waits for the first item, so that a failure before it is
        answered with a status, not an event.
        """
        started = False
        try:
            for item in items:
                if item is None:
                    yield None
                    continue
                if not started:
                    started = True
                    yield self.start()
                if isinstance(item, StreamEnd):
                    yield from self.end(item)
                else:
                    yield from self.chunk(item)
        finally:
            items.close()

    def start(self) -> dict[str, Any]:
        """Return ``message_start``: the message, no content yet, the prompt's count."""
        generation = self.generation
        message = message_body(
            message_id=generation.id,
            model=generation.model.id,
            content=[],
            stop_reason=None,
            usage=usage_body(starting_usage(generation)),
        )
        return message_start(message)

    def chunk(self, chunk: Chunk) -> list[dict[str, Any]]:
        """Return the events of one chunk's deltas."""
        events: list[dict[str, Any]] = []
        for choice in chunk.choices:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("reasoning"), str) and delta["reasoning"]:
                events += self.reasoning(delta["reasoning"])
            for detail in delta.get("reasoning_details") or ():
                events += self.reasoning_detail(detail)
            if isinstance(delta.get("content"), str) and delta["content"]:
                events += self.text(delta["content"])
            for call in delta.get("tool_calls") or ():
                events += self.tool_call(call)
            if choice.get("finish_reason"):
                self.stop_sequence = chunk.stop_sequence
                self.stop_reason = stop_reason_of(choice["finish_reason"], chunk.stop_sequence)
        return events

    def open_block(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        """Close the open block and open the next one; the first is followed by a ping."""
        events = self.close_block()
        self.index += 1
        self.open = kind
        events.append(block_start(self.index, block))
        if self.index == 0:
            events.append(PING)
        return events

    def close_block(self) -> list[dict[str, Any]]:
        """Close the open block; a thinking block gets its signature first."""
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            signature = self.signature or signature_of("".join(self.thinking))
            events.append(
                block_delta(self.index, {"type": "signature_delta", "signature": signature})
            )
            self.thinking, self.signature = [], None
        self.open = None
        events.append(block_stop(self.index))
        return events

    def reasoning(self, text: str) -> list[dict[str, Any]]:
        """Add reasoning to the open thinking block, opening one if needed."""
        events = []
        if self.open != "thinking":
            events += self.open_block(
                "thinking", {"type": "thinking", "thinking": "", "signature": ""}
            )
        self.thinking.append(text)
        if not self.omitted:
            events.append(block_delta(self.index, {"type": "thinking_delta", "thinking": text}))
        return events

    def reasoning_detail(self, detail: dict[str, Any]) -> list[dict[str, Any]]:
        """Take an upstream's signature for the thinking block; redacted thinking is a block."""
        if detail.get("type") == "reasoning.encrypted" and detail.get("data"):
            block = {"type": "redacted_thinking", "data": detail["data"]}
            return self.open_block("redacted_thinking", block) + self.close_block()
        if detail.get("signature") and self.open == "thinking":
            self.signature = detail["signature"]
        return []

    def text(self, text: str) -> list[dict[str, Any]]:
        """Add text to the open text block, opening one if needed."""
        events = []
        if self.open != "text":
            events += self.open_block("text", {"type": "text", "text": ""})
        events.append(block_delta(self.index, {"type": "text_delta", "text": text}))
        return events

    def tool_call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        """Open a tool call's block when it first appears; stream its arguments as JSON."""
        position = call.get("index", 0)
        function = call.get("function") or {}
        events = []
        if position not in self.calls:
            block = {
                "type": "tool_use",
                "id": call.get("id") or new_tool_use_id(),
                "name": function.get("name") or "",
                "input": {},
            }
            events += self.open_block("tool_use", block)
            self.calls[position] = self.index
        arguments = function.get("arguments")
        if not arguments:
            return events
        if self.calls[position] != self.index or self.open != "tool_use":
            # A block once closed cannot take more: no upstream seen interleaves calls.
            log.warning("tool call arguments for a closed block were dropped")
            return events
        events.append(
            block_delta(self.index, {"type": "input_json_delta", "partial_json": arguments})
        )
        return events

    def end(self, end: StreamEnd) -> list[dict[str, Any]]:
        """Close the last block; the message's stop reason, whole usage and cost; stop."""
        events = self.close_block()
        if end.finish_reason:
            stop_reason = stop_reason_of(end.finish_reason, self.stop_sequence)
        else:
            stop_reason = self.stop_reason or "end_turn"
        usage = usage_body(end.usage, end.cost)
        events.append(
            message_delta(stop_reason, usage, named_stop(stop_reason, self.stop_sequence))
        )
        events.append(MESSAGE_STOP)
        return events
