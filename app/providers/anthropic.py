"""Anthropic's Messages API, by translation both ways.

Out: system messages become ``system``; turns of the same role merge (the API wants them
alternating); images become base64 or url sources; tools get an ``input_schema``, tool
calls become ``tool_use`` blocks and tool messages ``tool_result`` blocks of a user turn;
``reasoning_effort`` becomes extended thinking with a token budget. Back: text, thinking
(``reasoning`` plus ``reasoning_details`` that keep the signature), tool calls, usage with
cache reads, and stop reasons as finish reasons; a stream's events become OpenAI chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from app.encoding import dumps, loads
from app.providers.base import (
    ChatRequest,
    Chunk,
    Completion,
    RouteTarget,
    UpstreamConfig,
    Usage,
    fingerprint_of,
)
from app.providers.errors import (
    UpstreamError,
    UpstreamMisconfigured,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from app.providers.event_stream import ServerSentEvent, read_events
from app.providers.http1 import UpstreamResponse
from app.providers.transport import (
    HttpUpstreamAdapter,
    as_count,
    prepared_url,
    received_chunks,
    release_response,
)

log = logging.getLogger(__name__)

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
# The server tools' calls Anthropic's usage counts (``server_tool_use``), by their priced name.
REPORTED_CALLS = {"web_search_requests": "web_search", "web_fetch_requests": "web_fetch"}
# The code execution tool's calls, which the usage does not count: their blocks are.
CODE_EXECUTION_TOOLS = frozenset(
    {"code_execution", "bash_code_execution", "text_editor_code_execution"}
)
# Thinking tokens per effort. The API takes no less than 1024, and wants the budget below
# max_tokens; at most three quarters of it, so that the answer keeps room of its own.
THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 24576}
MIN_THINKING_BUDGET = 1024
REASONING_FORMAT = "anthropic-claude-v1"
ERRORS_BY_TYPE: dict[str, type[UpstreamError]] = {
    "overloaded_error": UpstreamUnavailable,
    "rate_limit_error": UpstreamUnavailable,
    "timeout_error": UpstreamTimeout,
    "authentication_error": UpstreamMisconfigured,
    "permission_error": UpstreamMisconfigured,
    "not_found_error": UpstreamMisconfigured,
}


def text_of(content: Any) -> str:
    """Join the text parts of a message's content (a string is its own text)."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content or () if part.get("type") == "text")


def system_prompt(messages: list[dict[str, Any]]) -> str | None:
    """Join the system (and developer) messages, wherever they stand, into one prompt."""
    texts = [text_of(m.get("content")) for m in messages if m["role"] == "system"]
    return "\n\n".join(text for text in texts if text) or None


def image_block(part: dict[str, Any], where: str) -> dict[str, Any]:
    """Translate an image part: a base64 ``data:`` URI or an http(s) URL."""
    url = part["image_url"]["url"]
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    header, _, data = url.partition(",")
    media_type, _, encoding = header.removeprefix("data:").partition(";")
    if not header.startswith("data:") or encoding != "base64" or not data:
        raise UpstreamRejected(
            "An image must be an http(s) URL or a base64 data: URI for this model.",
            param=f"{where}.image_url.url",
        )
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def content_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """Translate a message's content into text and image blocks (empty texts dropped)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for index, part in enumerate(content or ()):
        if part.get("type") == "image_url":
            blocks.append(image_block(part, f"{where}.content[{index}]"))
        elif part.get("text"):
            blocks.append({"type": "text", "text": part["text"]})
    return blocks


def tool_use_block(call: dict[str, Any], where: str) -> dict[str, Any]:
    """Translate an assistant's earlier tool call; its arguments must be a JSON object."""
    function = call["function"]
    try:
        arguments = loads(function["arguments"] or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise UpstreamRejected(
            "Tool call arguments must be a JSON object for this model.",
            param=f"{where}.function.arguments",
        )
    return {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}


def turn_of(message: dict[str, Any], where: str) -> tuple[str, list[dict[str, Any]]]:
    """Translate one non-system message into a (role, blocks) turn."""
    role = message["role"]
    if role == "tool":
        content = message.get("content")
        result = content if isinstance(content, str) else content_blocks(content, where)
        block = {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": result}
        return "user", [block]
    blocks = content_blocks(message.get("content"), where)
    if role == "assistant":
        calls = message.get("tool_calls") or ()
        blocks += [tool_use_block(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
    return ("assistant" if role == "assistant" else "user"), blocks


def anthropic_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Translate the conversation, merging neighbouring turns of the same role."""
    turns: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if message["role"] == "system":
            continue
        role, blocks = turn_of(message, f"messages[{index}]")
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns


def tool_definitions(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Translate function tools into Anthropic tools with an ``input_schema``."""
    definitions = []
    for tool in tools:
        function = tool["function"]
        definition = {
            "name": function["name"],
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            definition["description"] = function["description"]
        definitions.append(definition)
    return definitions


def tool_choice(params: dict[str, Any]) -> dict[str, Any] | None:
    """Translate tool_choice and parallel_tool_calls (None: leave the API's default)."""
    choice, parallel = params.get("tool_choice"), params.get("parallel_tool_calls")
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        translated = {"type": "any"}
    elif isinstance(choice, dict):
        translated = {"type": "tool", "name": choice["function"]["name"]}
    elif choice == "auto" or parallel is False:
        translated = {"type": "auto"}
    else:
        return None
    if parallel is False:
        translated["disable_parallel_tool_use"] = True
    return translated


def thinking_budget(request: ChatRequest, target: RouteTarget, max_tokens: int) -> int | None:
    """Return the thinking budget ``reasoning_effort`` asks for, or None for no thinking.

    No thinking on a model without reasoning, when a tool is forced (the API refuses
    both at once), or while answering tool results: the API then wants the earlier turn's
    signed thinking back, which the contract's messages cannot carry.
    """
    effort = request.params.get("reasoning_effort")
    if effort not in THINKING_BUDGETS or "reasoning" not in target.capabilities:
        return None
    if request.params.get("tool_choice") not in (None, "none", "auto"):
        return None
    last_assistant = next((m for m in reversed(request.messages) if m["role"] == "assistant"), {})
    if last_assistant.get("tool_calls"):
        return None
    budget = min(THINKING_BUDGETS[effort], max_tokens * 3 // 4)
    return budget if budget >= MIN_THINKING_BUDGET else None


def messages_request(request: ChatRequest, target: RouteTarget) -> dict[str, Any]:
    """Build the body of POST /v1/messages."""
    if request.choice_count > 1:
        raise UpstreamRejected("This model returns one choice per request.", param="n")
    params = request.params
    max_tokens = request.max_output_tokens or target.max_output_tokens or DEFAULT_MAX_TOKENS
    body: dict[str, Any] = {
        "model": target.upstream_model,
        "max_tokens": max_tokens,
        "messages": anthropic_messages(request.messages),
    }
    if system := system_prompt(request.messages):
        body["system"] = system
    sampling_options(body, params, thinking_budget(request, target, max_tokens))
    if params.get("tools"):
        body["tools"] = tool_definitions(params["tools"])
        if choice := tool_choice(params):
            body["tool_choice"] = choice
    if params.get("user"):
        body["metadata"] = {"user_id": params["user"]}
    body.update((k, v) for k, v in request.extra.items() if k in target.extra_params)
    if request.stream:
        body["stream"] = True
    return body


def sampling_options(body: dict[str, Any], params: dict[str, Any], budget: int | None) -> None:
    """Set stop sequences, and thinking or temperature/top_p (thinking allows neither)."""
    stop = params.get("stop")
    if stop:
        body["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    if budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        return
    if "temperature" in params:
        # The contract's range is 0-2, Anthropic's 0-1.
        body["temperature"] = min(params["temperature"], 1)
    if "top_p" in params:
        body["top_p"] = params["top_p"]


def usage_from(
    raw: dict[str, Any], reasoning_tokens: int = 0, counted: Mapping[str, int] | None = None
) -> Usage:
    """Read Anthropic usage: the prompt is input plus cache reads and cache writes.

    Cache writes are split by TTL (``cache_creation``; all of them 5-minute ones without
    it); the server tools' calls are those the usage counts (``server_tool_use``) and
    those ``counted`` from the answer's blocks (``counted_calls``); the tier is the one
    the usage names.
    """
    cache_read = as_count(raw.get("cache_read_input_tokens"))
    cache_write = as_count(raw.get("cache_creation_input_tokens"))
    by_ttl = raw.get("cache_creation")
    one_hour = as_count(by_ttl.get("ephemeral_1h_input_tokens")) if type(by_ttl) is dict else 0
    if one_hour:
        cache_write = max(cache_write, one_hour + as_count(by_ttl.get("ephemeral_5m_input_tokens")))
    output = as_count(raw.get("output_tokens"))
    tier = raw.get("service_tier")
    return Usage(
        prompt_tokens=as_count(raw.get("input_tokens")) + cache_read + cache_write,
        completion_tokens=output,
        cached_tokens=cache_read,
        cache_write_tokens=cache_write,
        reasoning_tokens=min(reasoning_tokens, output),
        cache_write_1h_tokens=one_hour,
        tool_calls=server_tool_calls(raw.get("server_tool_use"), counted),
        service_tier=tier if type(tier) is str else None,
    )


def kept_usage(usage: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Yield what a stream's usage object says: counts, their breakdowns, the tier.

    Each event's usage holds running totals: a later one replaces what it names.
    """
    for key, value in usage.items():
        if type(value) is int or type(value) is dict or key == "service_tier":
            yield key, value


def server_tool_calls(reported: Any, counted: Mapping[str, int] | None) -> dict[str, int] | None:
    """Return the server tools' calls: those the usage reports, and those ``counted``."""
    calls = dict(counted or ())
    if type(reported) is dict:
        for key, tool in REPORTED_CALLS.items():
            if count := as_count(reported.get(key)):
                calls[tool] = calls.get(tool, 0) + count
    return calls or None


def called_tool(block: Any) -> str | None:
    """Return the priced tool a content block is a call of, for tools the usage does not count."""
    if type(block) is not dict:
        return None
    kind = block.get("type")
    if kind == "server_tool_use" and block.get("name") in CODE_EXECUTION_TOOLS:
        return "code_execution"
    return "mcp" if kind == "mcp_tool_use" else None


def counted_calls(blocks: Any, container: Any = None) -> dict[str, int]:
    """Count the calls of an answer's blocks (``called_tool``), and the container it used."""
    calls: dict[str, int] = {"container": 1} if type(container) is dict else {}
    for block in blocks if type(blocks) is list else ():
        if tool := called_tool(block):
            calls[tool] = calls.get(tool, 0) + 1
    return calls


def reported_reasoning_tokens(raw: dict[str, Any]) -> int | None:
    """Return the thinking tokens the usage reports, when it does."""
    details = raw.get("output_tokens_details")
    return as_count(details.get("thinking_tokens")) if isinstance(details, dict) else None


def reasoning_detail(block: dict[str, Any], index: int) -> dict[str, Any] | None:
    """Translate a thinking or redacted_thinking block into a reasoning_details entry."""
    if block.get("type") == "thinking":
        detail = {"type": "reasoning.text", "text": block.get("thinking") or ""}
        detail["signature"] = block.get("signature")
    elif block.get("type") == "redacted_thinking":
        detail = {"type": "reasoning.encrypted", "data": block.get("data")}
    else:
        return None
    return {**detail, "format": REASONING_FORMAT, "index": index}


def tool_call_of(block: dict[str, Any]) -> dict[str, Any]:
    """Translate a tool_use block into the contract's ToolCall."""
    arguments = dumps(block.get("input") or {}).decode()
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": arguments},
    }


def message_from(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Translate a response's content blocks into the contract's ResponseMessage."""
    texts = [b.get("text") or "" for b in blocks if b.get("type") == "text"]
    details = [d for i, b in enumerate(blocks) if (d := reasoning_detail(b, i))]
    calls = [tool_call_of(b) for b in blocks if b.get("type") == "tool_use"]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
        "refusal": None,
    }
    if details:
        message["reasoning"] = "".join(d.get("text", "") for d in details) or None
        message["reasoning_details"] = details
    if calls:
        message["tool_calls"] = calls
    return message


def stream_error(payload: dict[str, Any]) -> Exception:
    """Map an ``error`` event (or error body) to the gateway's error."""
    error = payload.get("error") if isinstance(payload.get("error"), dict) else {}
    kind, message = error.get("type"), error.get("message")
    if kind in ("invalid_request_error", "request_too_large") and isinstance(message, str):
        return UpstreamRejected(message)
    log.warning("anthropic upstream error event: %s", kind)
    return ERRORS_BY_TYPE.get(kind, UpstreamError)()


class StreamTranslation:
    """Turns one Anthropic event stream into OpenAI-shaped chunks, keeping what it needs.

    Tool-call indexes count tool_use blocks (0, 1, ...), whatever their block index.
    """

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self.usage: dict[str, Any] = {}
        # The server tools' calls counted from the blocks (see counted_calls).
        self.calls: dict[str, int] = {}
        self.tool_indexes: dict[int, int] = {}
        self.thinking: list[str] = []
        self.finished = False
        # The last chunk relayed said more, and no chunk since has ended its read.
        self.held = False

    def relay(self, event: ServerSentEvent) -> Chunk | None:
        """Return the chunk to relay for ``event``, saying whether its read has more.

        A read that ends on an event with nothing to relay (a ping, a block's end) gets
        an empty chunk, so that what came before it goes now; the end of the message
        needs none, the usage follows at once.
        """
        chunk = self.chunk_for(event)
        if chunk is not None:
            chunk.system_fingerprint = self.fingerprint
            chunk.more = self.held = event.more
            return chunk
        if self.held and not event.more and not self.finished:
            self.held = False
            return Chunk(choices=[], system_fingerprint=self.fingerprint)
        return None

    def chunk_for(self, event: ServerSentEvent) -> Chunk | None:
        """Return the chunk an event stands for, if any; raise on an error event."""
        if event.event == "ping":
            return None
        try:
            payload = loads(event.data)
        except ValueError:
            raise UpstreamError("The model's upstream sent a malformed event.") from None
        kind = payload.get("type") if isinstance(payload, dict) else None
        if kind == "error":
            raise stream_error(payload)
        if kind == "message_start":
            self.take_usage((payload.get("message") or {}).get("usage"))
            # The prompt's exact count, early: billing uses it if the stream breaks off.
            chunk = delta_chunk({"role": "assistant", "content": ""})
            chunk.usage = usage_from(self.usage)
            return chunk
        if kind == "content_block_start":
            block = payload.get("content_block") or {}
            if tool := called_tool(block):
                self.calls[tool] = self.calls.get(tool, 0) + 1
            return self.block_start(payload.get("index", 0), block)
        if kind == "content_block_delta":
            return self.block_delta(payload.get("index", 0), payload.get("delta") or {})
        if kind == "message_delta":
            return self.message_delta(payload)
        self.finished = self.finished or kind == "message_stop"
        return None

    def message_delta(self, payload: dict[str, Any]) -> Chunk | None:
        """Take the answer's final usage and container; its stop reason finishes the choice."""
        self.take_usage(payload.get("usage"))
        delta = payload.get("delta") or {}
        if type(delta.get("container")) is dict:
            self.calls["container"] = 1
        if not (reason := delta.get("stop_reason")):
            return None
        chunk = delta_chunk({}, FINISH_REASONS.get(reason, "stop"))
        chunk.stop_sequence = matched_stop(delta)
        return chunk

    def take_usage(self, usage: Any) -> None:
        """Keep the counts of a usage object; message_delta's output_tokens is a running total."""
        if isinstance(usage, dict):
            self.usage.update(kept_usage(usage))

    def block_start(self, index: int, block: dict[str, Any]) -> Chunk | None:
        """Open a content block: a tool call announces its id and name."""
        kind = block.get("type")
        if kind == "tool_use":
            position = self.tool_indexes[index] = len(self.tool_indexes)
            function = {"name": block.get("name"), "arguments": ""}
            call = {
                "index": position,
                "id": block.get("id"),
                "type": "function",
                "function": function,
            }
            return delta_chunk({"tool_calls": [call]})
        if kind == "redacted_thinking":
            return delta_chunk({"reasoning_details": [reasoning_detail(block, index)]})
        if kind == "text" and block.get("text"):
            return delta_chunk({"content": block["text"]})
        return None

    def block_delta(self, index: int, delta: dict[str, Any]) -> Chunk | None:
        """Translate one delta of a content block."""
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            return delta_chunk({"content": delta["text"]})
        if kind == "thinking_delta" and delta.get("thinking"):
            self.thinking.append(delta["thinking"])
            return delta_chunk({"reasoning": delta["thinking"]})
        if kind == "signature_delta":
            detail = {"type": "reasoning.text", "signature": delta.get("signature")}
            detail.update(format=REASONING_FORMAT, index=index)
            return delta_chunk({"reasoning_details": [detail]})
        if kind == "input_json_delta" and delta.get("partial_json") and index in self.tool_indexes:
            call = {
                "index": self.tool_indexes[index],
                "function": {"arguments": delta["partial_json"]},
            }
            return delta_chunk({"tool_calls": [call]})
        return None


def matched_stop(answer: dict[str, Any]) -> str | None:
    """Return the stop sequence a Message (or message_delta's delta) says it stopped on."""
    stop = answer.get("stop_sequence")
    return stop if answer.get("stop_reason") == "stop_sequence" and isinstance(stop, str) else None


def delta_chunk(delta: dict[str, Any], finish_reason: str | None = None) -> Chunk:
    """Build a chunk of the one choice an Anthropic answer has."""
    return Chunk(choices=[{"index": 0, "delta": delta, "finish_reason": finish_reason}])


class AnthropicAdapter(HttpUpstreamAdapter):
    """Calls ``{base_url}/v1/messages``, translating to and from the contract's shapes."""

    kind = "anthropic"
    # Claude's tokenizer is not public; it counts about a fifth more tokens than
    # cl100k_base for the same English text, more for code.
    # Anthropic's Messages API passes through to its own /v1/messages, with the caller's
    # version and betas (Claude Code's fields need theirs), the gateway's key.
    native_apis = frozenset({"messages"})
    native_paths = {"messages": "/v1/messages"}
    passed_on_headers = ("anthropic-version", "anthropic-beta")
    token_ratio = 1.2
    # The Messages API has no ``detail``: a low-detail image is billed like any other.
    low_detail_image_tokens = None

    def __init__(self, upstream: UpstreamConfig) -> None:
        super().__init__(upstream)
        self.url = prepared_url(f"{(upstream.base_url or '').rstrip('/')}/v1/messages")

    def headers(self) -> dict[str, str]:
        """Return the request headers: the API version and, if configured, the key."""
        headers = {"Content-Type": "application/json", "anthropic-version": API_VERSION}
        if key := self.api_key():
            headers["x-api-key"] = key
        return headers

    def call(self, request: ChatRequest, target: RouteTarget) -> UpstreamResponse:
        """Send the translated request; return the upstream's successful response."""
        return self.post(
            self.url,
            messages_request(request, target),
            self.headers(),
            stream=request.stream,
            public_model=request.model,
        )

    def complete(self, request: ChatRequest, target: RouteTarget) -> Completion:
        """Ask for the whole answer and translate it back."""
        body = self.read_json(self.call(request, target))
        if body.get("type") == "error":
            raise stream_error(body)
        message = message_from(body.get("content") or [])
        raw_usage = body.get("usage") or {}
        reasoning = reported_reasoning_tokens(raw_usage)
        if reasoning is None:
            reasoning = self.count_text_tokens(message.get("reasoning") or "", target)
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": FINISH_REASONS.get(body.get("stop_reason"), "stop"),
            "logprobs": None,
        }
        return Completion(
            choices=[choice],
            usage=usage_from(
                raw_usage, reasoning, counted_calls(body.get("content"), body.get("container"))
            ),
            system_fingerprint=self.fingerprint(target),
            stop_sequence=matched_stop(body),
        )

    def stream(self, request: ChatRequest, target: RouteTarget) -> Iterator[Chunk]:
        """Relay the translated events as they arrive, then the usage."""
        response = self.call(request, target)
        translation = StreamTranslation(self.fingerprint(target))
        try:
            # Each event is relayed by a call, not in this loop's body, whose variables
            # would keep the last event for as long as the stream waits for the next.
            for chunk in map(translation.relay, read_events(received_chunks(response))):
                if chunk is not None:
                    yield chunk
                if translation.finished:
                    break
            else:
                raise UpstreamError("The model's upstream ended the answer early.")
            # Yielded before the connection's release, which may wait for the body's end.
            yield Chunk(
                choices=[],
                usage=self.stream_usage(translation, target),
                system_fingerprint=translation.fingerprint,
            )
        finally:
            # Also when the caller went away: the upstream stops generating at once.
            release_response(response, complete=translation.finished)

    def stream_usage(self, translation: StreamTranslation, target: RouteTarget) -> Usage:
        """Return a finished stream's usage, its reasoning counted if Anthropic did not."""
        reasoning = reported_reasoning_tokens(translation.usage)
        if reasoning is None:
            reasoning = self.count_text_tokens("".join(translation.thinking), target)
        return usage_from(translation.usage, reasoning, translation.calls)

    def fingerprint(self, target: RouteTarget) -> str:
        """Return the system_fingerprint of this model's answers: Anthropic sends none."""
        return fingerprint_of(self.kind, self.upstream.name, target.upstream_model)
