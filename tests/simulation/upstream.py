"""A simulated upstream: every chunk, usage figure and failure is the simulator's choice.

The adapter knows nothing of time or scheduling: the simulator decides when each chunk is
pulled by advancing the gateway's generator, and what the upstream will do by writing the
request's ``UpstreamScript`` before the request starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from app.providers.base import (
    Adapter,
    ChatRequest,
    Chunk,
    Completion,
    NativeAnswer,
    NativeCall,
    RouteTarget,
    UpstreamConfig,
    Usage,
)
from app.providers.errors import UpstreamError, UpstreamTimeout

SCRIPT_FIELD = "simulation_request"
WORD = "tok"
# The events of a passed-through Messages stream around its text.
TEXT_BLOCK = {
    "type": "content_block_start",
    "index": 0,
    "content_block": {"type": "text", "text": ""},
}
BLOCK_STOP = {"type": "content_block_stop", "index": 0}
MESSAGE_STOP = {"type": "message_stop"}


@dataclass
class UpstreamScript:
    """What the upstream will do for one request.

    ``chunk_tokens`` are the content chunks in order (tokens each); ``reported`` is the
    usage sent after the last one (None: the upstream sends none); ``early_prompt`` is a
    prompt count sent with the first chunk, as Anthropic's ``message_start`` does;
    ``fail_before`` is the chunk index before which the upstream fails (the number of
    chunks: after the content, before the usage).
    """

    prompt_estimate: int
    chunk_tokens: list[int] = field(default_factory=list)
    reported: Usage | None = None
    early_prompt: int | None = None
    fail_before: int | None = None
    # Set by the simulator when the upstream has been silent for longer than its read
    # timeout: the next read fails, as it would through ``requests``.
    timed_out: bool = False
    # How far above its count the gateway bounds the prompt before counting it (a body
    # passed through is counted at once: its bound is its count).
    bound_factor: int = 2
    # A body passed through: what its upstream was sent, read by the upstream's own
    # rules (the words of every text of its messages), and the ``max_tokens`` it got.
    sent_prompt: int | None = None
    sent_max_tokens: int | None = None

    @property
    def prompt_bound(self) -> int:
        """The bound of the prompt's tokens the gateway sizes a hold by before it counts."""
        return self.bound_factor * self.prompt_estimate

    @property
    def completion_tokens(self) -> int:
        """Every token of content the upstream would deliver if nothing failed."""
        return sum(self.chunk_tokens)


def words(tokens: int) -> str:
    """Text of exactly ``tokens`` tokens, as this upstream counts them."""
    return " ".join([WORD] * tokens)


class SimulatedAdapter(Adapter):
    """An upstream that plays each request's script."""

    kind = "simulated"

    def __init__(self) -> None:
        super().__init__(UpstreamConfig(name="simulated", kind=self.kind, retries=0))
        self.scripts: dict[int, UpstreamScript] = {}

    def script_for(self, request: ChatRequest) -> UpstreamScript:
        """The script of the simulated request ``request`` carries."""
        return self.scripts[request.extra[SCRIPT_FIELD]]

    def count_prompt_tokens(
        self, request: ChatRequest, target: RouteTarget, *, limit: int | None = None
    ) -> int:
        """The gateway's count of the prompt, as the script says (whatever ``limit``)."""
        return self.script_for(request).prompt_estimate

    def prompt_token_bound(self, request: ChatRequest, target: RouteTarget) -> int:
        """A bound above the count, as a prompt's size in bytes is: a short balance recounts."""
        return self.script_for(request).prompt_bound

    def count_text_tokens(self, text: str, target: RouteTarget) -> int:
        """One token per word."""
        return len(text.split())

    def complete(self, request: ChatRequest, target: RouteTarget) -> Completion:
        """Answer whole, or fail; without reported usage the adapter counts, as real ones do."""
        script = self.script_for(request)
        if script.timed_out:
            raise UpstreamTimeout()
        if script.fail_before is not None:
            raise UpstreamError("The simulated upstream failed.")
        usage = script.reported or Usage()
        if script.reported is None and script.completion_tokens:
            usage = Usage(
                prompt_tokens=script.prompt_estimate,
                completion_tokens=script.completion_tokens,
                estimated=True,
            )
        message = {"role": "assistant", "content": words(script.completion_tokens)}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        return Completion(choices=[choice], usage=usage)

    def stream(self, request: ChatRequest, target: RouteTarget) -> Iterator[Chunk]:
        """Yield the script's chunks, failing where it says, usage last."""
        script = self.script_for(request)
        last = len(script.chunk_tokens) - 1
        for index, tokens in enumerate(script.chunk_tokens):
            if script.timed_out:
                raise UpstreamTimeout()
            if index == script.fail_before:
                raise UpstreamError("The simulated upstream broke off.")
            early = script.early_prompt if index == 0 else None
            delta = {"index": 0, "delta": {"content": words(tokens)}}
            delta["finish_reason"] = "stop" if index == last else None
            yield Chunk(
                choices=[delta],
                usage=None if early is None else Usage(prompt_tokens=early),
            )
        if script.timed_out:
            raise UpstreamTimeout()
        if script.fail_before == len(script.chunk_tokens):
            raise UpstreamError("The simulated upstream broke off before its usage.")
        if script.reported is not None:
            yield Chunk(choices=[], usage=script.reported)


@dataclass(frozen=True)
class NativeUsage:
    """How an upstream that passes Messages through splits the prompt it read.

    Of the prompt, ``cache_read`` tokens came from its cache, ``write_5m`` and
    ``write_1h`` were written to it with either TTL; ``web_searches`` is how many server
    web searches it ran.
    """

    cache_read: int = 0
    write_5m: int = 0
    write_1h: int = 0
    web_searches: int = 0


def texts_of(value: object) -> list[str]:
    """Every string inside ``value``, at any depth (dicts' values only)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text for item in value for text in texts_of(item)]
    if isinstance(value, dict):
        return texts_of(list(value.values()))
    return []


class SimulatedNativeAdapter(SimulatedAdapter):
    """An upstream that serves Anthropic's Messages API and OpenAI's Responses API itself.

    Bodies pass through whole. It reads the prompt of what it is sent by its own rule,
    the words of every text of the messages or input items (whatever block holds them),
    and answers Messages with usage that splits them into cache reads and writes of both
    TTLs, plus the web searches its script says; Responses with its cache reads.
    """

    native_apis = frozenset({"messages", "responses"})

    def __init__(self) -> None:
        super().__init__()
        self.upstream = UpstreamConfig(name="simulated-native", kind=self.kind, retries=0)
        self.split: dict[int, NativeUsage] = {}

    def relay(self, call: NativeCall, target: RouteTarget) -> NativeAnswer:
        """Answer the body whole, as the script says; note what was sent first."""
        script, split = self.sent(call)
        if script.timed_out:
            raise UpstreamTimeout()
        if script.fail_before is not None:
            raise UpstreamError("The simulated upstream failed.")
        text = {"type": "text", "text": words(script.completion_tokens)}
        message = {
            "id": f"msg_sim{call.body[SCRIPT_FIELD]}",
            "type": "message",
            "role": "assistant",
            "content": [text],
            "stop_reason": "end_turn",
            "usage": self.usage(call, script, split),
        }
        body = json.dumps(message).encode()
        return NativeAnswer(body=body, decoded=message)

    def relay_stream(self, call: NativeCall, target: RouteTarget) -> Iterator[bytes]:
        """Stream the answer as Anthropic does, one read per chunk, failing where it says.

        The first read is ``message_start`` (the prompt's usage, one output token) with the
        text block's start; the last brings the last text with the block's stop,
        ``message_delta`` (the whole usage) and ``message_stop``. A script that fails
        after its content (``fail_before`` = its chunks) sends the last text alone.
        """
        if call.api == "responses":
            yield from self.relay_response_stream(call)
            return
        script, split = self.sent(call)
        usage = self.usage(call, script, split)
        started = {**usage, "output_tokens": 1}
        del started["server_tool_use"]
        message = {
            "id": f"msg_sim{call.body[SCRIPT_FIELD]}",
            "type": "message",
            "role": "assistant",
            "content": [],
            "stop_reason": None,
            "usage": started,
        }
        yield self.read(script, {"type": "message_start", "message": message}, TEXT_BLOCK)
        chunks = script.chunk_tokens
        for index, tokens in enumerate(chunks):
            if index == script.fail_before:
                raise UpstreamError("The simulated upstream broke off.")
            delta = {"type": "content_block_delta", "index": 0}
            delta["delta"] = {"type": "text_delta", "text": words(tokens)}
            if index < len(chunks) - 1 or script.fail_before == len(chunks):
                yield self.read(script, delta)
                continue
            ending = {"type": "message_delta", "usage": usage}
            ending["delta"] = {"stop_reason": "end_turn", "stop_sequence": None}
            yield self.read(script, delta, BLOCK_STOP, ending, MESSAGE_STOP)
        if script.fail_before == len(chunks):
            raise UpstreamError("The simulated upstream broke off before its usage.")

    def relay_response_stream(self, call: NativeCall) -> Iterator[bytes]:
        """Stream a Responses answer as OpenAI does, one read per chunk, failing as it says.

        The first read is ``response.created`` with the message item's addition; the last
        brings the last text with ``response.output_text.done`` and ``response.completed``,
        whose response alone reports the usage (the prompt it read, its cache reads).
        """
        script, split = self.sent(call)
        number = call.body[SCRIPT_FIELD]
        response = {"id": f"resp_sim{number}", "object": "response", "output": [], "usage": None}
        item = {"id": f"msg_sim{number}", "type": "message", "role": "assistant", "content": []}
        created = {"type": "response.created", "response": {**response, "status": "in_progress"}}
        added = {"type": "response.output_item.added", "output_index": 0, "item": item}
        yield self.read(script, created, added)
        chunks = script.chunk_tokens
        for index, tokens in enumerate(chunks):
            if index == script.fail_before:
                raise UpstreamError("The simulated upstream broke off.")
            delta = {"type": "response.output_text.delta", "delta": words(tokens)}
            if index < len(chunks) - 1 or script.fail_before == len(chunks):
                yield self.read(script, delta)
                continue
            text = words(script.completion_tokens)
            done = {"type": "response.output_text.done", "text": text}
            content = [{"type": "output_text", "text": text, "annotations": []}]
            usage = {
                "input_tokens": script.sent_prompt,
                "input_tokens_details": {"cached_tokens": split.cache_read},
                "output_tokens": script.completion_tokens,
            }
            answered = {
                **response,
                "status": "completed",
                "output": [{**item, "status": "completed", "content": content}],
                "usage": usage,
            }
            yield self.read(
                script, delta, done, {"type": "response.completed", "response": answered}
            )
        if script.fail_before == len(chunks):
            raise UpstreamError("The simulated upstream broke off before its response.")

    @staticmethod
    def read(script: UpstreamScript, *events: dict[str, object]) -> bytes:
        """One read of the stream: ``events`` as server-sent events, or the read timing out."""
        if script.timed_out:
            raise UpstreamTimeout()
        return b"".join(
            f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events
        )

    def sent(self, call: NativeCall) -> tuple[UpstreamScript, NativeUsage]:
        """The script of the request ``call`` passes through; note what it was sent."""
        number = call.body[SCRIPT_FIELD]
        script, split = self.scripts[number], self.split[number]
        if call.api == "responses":
            script.sent_prompt = sum(len(t.split()) for t in texts_of(call.body["input"]))
            script.sent_max_tokens = call.body["max_output_tokens"]
        else:
            script.sent_prompt = sum(len(t.split()) for t in texts_of(call.body["messages"]))
            script.sent_max_tokens = call.body["max_tokens"]
        return script, split

    @staticmethod
    def usage(call: NativeCall, script: UpstreamScript, split: NativeUsage) -> dict[str, object]:
        """The usage the upstream reports: the prompt it read, split by its cache."""
        cached = split.cache_read + split.write_5m + split.write_1h
        return {
            "input_tokens": script.sent_prompt - cached,
            "output_tokens": script.completion_tokens,
            "cache_read_input_tokens": split.cache_read,
            "cache_creation_input_tokens": split.write_5m + split.write_1h,
            "cache_creation": {
                "ephemeral_5m_input_tokens": split.write_5m,
                "ephemeral_1h_input_tokens": split.write_1h,
            },
            "server_tool_use": {"web_search_requests": split.web_searches},
            # Anthropic names the tier it served in: the one asked for, else its standard.
            "service_tier": call.body.get("service_tier") or "standard",
        }
