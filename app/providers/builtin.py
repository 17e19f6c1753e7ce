"""The built-in development model. It is not a language model: it writes text by fixed rules.

It needs no upstream, so a fresh checkout answers offline, and it is the test double of the
whole gateway: its rules exercise every feature of the chat-completions contract (echoed
replies with a seeded tail sentence, stop and length cut-offs, n choices, tool calls whose
arguments are generated from their JSON Schemas, JSON output, reasoning traces, logprobs,
image and cached prompt tokens, streaming that reassembles into the same answer). Nothing
here understands language. ``docs/builtin-model.md`` states the rules, so a developer can
predict every output.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.errors import InvalidRequest
from app.providers.base import (
    Adapter,
    ChatRequest,
    Chunk,
    Completion,
    EmbeddingRequest,
    Embeddings,
    RouteTarget,
    UpstreamConfig,
    Usage,
)
from app.providers.errors import UpstreamError, UpstreamRejected
from app.providers.hashed_vectors import NATIVE_DIMENSIONS, hashed_vector
from app.providers.schema_instances import InstanceTooLarge, schema_instance
from app.providers.tokens import prompt_token_bound
from app.providers.vectors import Vector

# A word token holds at most WORD_TOKEN_CHARACTERS: a 5 MB "word" is as many tokens as a
# real tokenizer would make of it, not one that slips past any context length.
WORD_TOKEN_CHARACTERS = 16
TOKEN_PATTERN = re.compile(rf"\s*\w{{1,{WORD_TOKEN_CHARACTERS}}}|\s*[^\w\s]|\s+")
PROMPT_WORD_PATTERN = re.compile(r"[A-Za-z]{3,}")
MESSAGE_OVERHEAD_TOKENS = 4
REPLY_OVERHEAD_TOKENS = 3
LOW_DETAIL_IMAGE_TOKENS = 85
IMAGE_TOKENS = 765
CACHE_MIN_TOKENS = 32
CACHE_CAPACITY = 10_000
DEFAULT_REASONING_EFFORT = "medium"
REASONING_TOKENS = {"none": 0, "minimal": 16, "low": 16, "medium": 48, "high": 128}
SYSTEM_FINGERPRINT = "fp_builtin_v1"
FAILURE_MESSAGE = "The builtin upstream failed mid-stream (fail_after_tokens)."
VOCABULARY = (
    "answer", "basket", "bridge", "bright", "button", "candle", "careful", "clear",
    "cloud", "copper", "early", "field", "forest", "friendly", "garden", "gentle",
    "green", "harbor", "honest", "kitchen", "ladder", "lantern", "letter", "light",
    "little", "market", "meadow", "mirror", "morning", "music", "number", "ocean",
    "orange", "paper", "pencil", "planet", "pocket", "quiet", "rabbit", "river",
    "rocket", "shadow", "signal", "silver", "simple", "steady", "stone", "summer",
    "table", "thread", "ticket", "travel", "tunnel", "valley", "village", "violet",
    "wander", "warm", "window", "winter", "wooden", "yellow", "yonder", "zebra",
)  # fmt: skip


def tokenize(text: str) -> list[str]:
    """Split ``text`` into tokens that concatenate back to it exactly."""
    return TOKEN_PATTERN.findall(text)


def count_tokens(text: str) -> int:
    """Count the tokens of ``text``."""
    return len(TOKEN_PATTERN.findall(text))


def content_parts(content: Any) -> list[dict[str, Any]]:
    """Return a message's content as a list of parts (a string is one text part)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [part for part in content or () if isinstance(part, dict)]


def text_parts(message: dict[str, Any]) -> list[str]:
    """Return the texts of a message's text parts."""
    parts = content_parts(message.get("content"))
    return [part.get("text") or "" for part in parts if part.get("type") == "text"]


def image_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Return a message's image parts."""
    return [
        part for part in content_parts(message.get("content")) if part.get("type") == "image_url"
    ]


def message_text(message: dict[str, Any] | None) -> str:
    """Return a message's text parts joined by newlines ("" for no message)."""
    return "\n".join(text_parts(message)) if message else ""


def last_user_message(messages: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Return the most recent message with role user, if any."""
    return next((m for m in reversed(messages) if m.get("role") == "user"), None)


def least_prompt_tokens(request: ChatRequest) -> int:
    """Return a lower bound of the prompt's tokens: its text parts' non-space characters."""
    characters = sum(
        sum(map(len, text.split())) for message in request.messages for text in text_parts(message)
    )
    return -(-characters // WORD_TOKEN_CHARACTERS)


def message_tokens(message: dict[str, Any]) -> int:
    """Count a message's text tokens: overhead, text parts, name and tool calls (no images)."""
    tokens = MESSAGE_OVERHEAD_TOKENS + count_tokens(message.get("name") or "")
    tokens += sum(count_tokens(text) for text in text_parts(message))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        tokens += count_tokens(function.get("name") or "")
        tokens += count_tokens(str(function.get("arguments") or ""))
    return tokens


def image_tokens(part: dict[str, Any], target: RouteTarget) -> int:
    """Count an image part's tokens; 0 on a model without vision."""
    if "vision" not in target.capabilities:
        return 0
    detail = (part.get("image_url") or {}).get("detail")
    return LOW_DETAIL_IMAGE_TOKENS if detail == "low" else IMAGE_TOKENS


def response_schema(response_format: Any) -> Any:
    """Return the JSON Schema a json_schema response_format asks for, or None."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    return (response_format.get("json_schema") or {}).get("schema")


def prompt_words(messages: Sequence[dict[str, Any]]) -> list[str]:
    """Return the words of 3+ letters of the last user message, which instances' strings use."""
    return PROMPT_WORD_PATTERN.findall(message_text(last_user_message(messages)))


def tool_parameters(tool: dict[str, Any]) -> Any:
    """Return the JSON Schema of a tool's arguments (an empty object when it declares none)."""
    return (tool.get("function") or {}).get("parameters") or {"type": "object"}


def bounded_instance(schema: Any, words: Sequence[str], param: str) -> Any:
    """Generate an instance of the caller's ``schema``; raise InvalidRequest past its budget."""
    try:
        return schema_instance(schema, words)
    except InstanceTooLarge as error:
        raise InvalidRequest(
            f"{param} is too large to generate an instance of: {error}.",
            param=param,
            code="schema_too_large",
        ) from None


def check_schema_instances(request: ChatRequest) -> None:
    """Refuse schemas whose instance would exceed the budget, before anything is held."""
    schema = response_schema(request.params.get("response_format"))
    if not request.params.get("tools") and schema is None:
        return
    words = prompt_words(request.messages)
    for index, tool in enumerate(request.params.get("tools") or ()):
        if tool_name(tool):
            bounded_instance(tool_parameters(tool), words, f"tools[{index}].function.parameters")
    if schema is not None:
        bounded_instance(schema, words, "response_format.json_schema.schema")


def declaration_tokens(params: dict[str, Any]) -> int:
    """Count the tokens of the tool definitions and the response schema a request carries."""
    tokens = count_tokens(json.dumps(params["tools"], sort_keys=True)) if params.get("tools") else 0
    schema = response_schema(params.get("response_format"))
    if schema is not None:
        tokens += count_tokens(json.dumps(schema))
    return tokens


def prefix_digests(model: str, messages: Sequence[dict[str, Any]]) -> list[str]:
    """Return the cumulative sha256 of messages[0..k] for every k, seeded with the model."""
    hasher = hashlib.sha256(model.encode())
    digests = []
    for message in messages:
        canonical = json.dumps(
            message, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
        )
        hasher.update(canonical.encode() + b"\n")
        digests.append(hasher.hexdigest())
    return digests


@dataclass(frozen=True)
class Prompt:
    """What the model reads of a request: its token counts and the digests of its prefixes.

    ``prefix_tokens[k]`` and ``prefix_digests[k]`` describe messages[0..k]: their text tokens
    (per-message overhead included, images not) and the digest the prompt cache keys on.
    """

    text_tokens: int
    image_tokens: int
    prefix_tokens: tuple[int, ...]
    prefix_digests: tuple[str, ...]
    digest: str

    @property
    def tokens(self) -> int:
        """All prompt tokens, images included."""
        return self.text_tokens + self.image_tokens


def read_prompt(request: ChatRequest, target: RouteTarget) -> Prompt:
    """Count the prompt tokens of ``request`` on ``target`` and digest its message prefixes."""
    per_message = [message_tokens(message) for message in request.messages]
    images = sum(
        image_tokens(part, target) for message in request.messages for part in image_parts(message)
    )
    digests = prefix_digests(target.upstream_model, request.messages)
    return Prompt(
        text_tokens=sum(per_message) + REPLY_OVERHEAD_TOKENS + declaration_tokens(request.params),
        image_tokens=images,
        prefix_tokens=tuple(itertools.accumulate(per_message)),
        prefix_digests=tuple(digests),
        digest=digests[-1]
        if digests
        else hashlib.sha256(target.upstream_model.encode()).hexdigest(),
    )


class PromptCache:
    """A bounded, thread-safe LRU set of the message-prefix digests this process has answered."""

    def __init__(self, capacity: int = CACHE_CAPACITY) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def cached_tokens(self, prompt: Prompt) -> int:
        """Return the text tokens of the longest seen prefix (not the last message), if >= 32."""
        with self._lock:
            for k in range(len(prompt.prefix_digests) - 2, -1, -1):
                if prompt.prefix_tokens[k] < CACHE_MIN_TOKENS:
                    break
                if prompt.prefix_digests[k] in self._seen:
                    self._seen.move_to_end(prompt.prefix_digests[k])
                    return prompt.prefix_tokens[k]
        return 0

    def remember(self, prompt: Prompt) -> None:
        """Record every prefix of ``prompt``, forgetting the least recently used beyond capacity."""
        with self._lock:
            for digest in prompt.prefix_digests:
                self._seen[digest] = None
                self._seen.move_to_end(digest)
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)


def choice_rng(params: dict[str, Any], index: int, digest: str) -> random.Random:
    """Return one choice's random stream: reproducible under a seed or temperature 0."""
    if params.get("seed") is not None:
        return random.Random(f"{params['seed']}:{index}:{digest}")
    if params.get("temperature") == 0:
        return random.Random(f"t0:{index}:{digest}")
    return random.Random()


def tail_sentence(rng: random.Random) -> str:
    """Draw a sentence of 4 to 12 vocabulary words, capitalized and ending with a period."""
    words = [rng.choice(VOCABULARY) for _ in range(rng.randint(4, 12))]
    return " ".join([words[0].capitalize(), *words[1:]]) + "."


def echo_text(message: dict[str, Any] | None) -> str:
    """Return what the reply echoes of the last user message: its text, or its image count."""
    text = message_text(message)
    if not text and message and image_parts(message):
        return f"I see {len(image_parts(message))} image(s)."
    return text


def reply_text(messages: Sequence[dict[str, Any]], rng: random.Random) -> str:
    """Write the reply: a tool result acknowledged, or the user's text echoed with a tail."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return "Tool result received: " + message_text(last)
    return " ".join(filter(None, (echo_text(last_user_message(messages)), tail_sentence(rng))))


def format_content(reply: str, response_format: Any, words: Sequence[str]) -> str:
    """Shape the reply as the response_format asks: plain, {"reply": ...}, or a schema instance."""
    schema = response_schema(response_format)
    if schema is not None:
        return json.dumps(bounded_instance(schema, words, "response_format.json_schema.schema"))
    if isinstance(response_format, dict) and response_format.get("type") in (
        "json_object",
        "json_schema",
    ):
        return json.dumps({"reply": reply})
    return reply


def cut_at_stop(text: str, stop: str | Sequence[str] | None) -> tuple[str, str | None]:
    """Cut ``text`` before the earliest occurrence of any stop sequence; return it and that one."""
    matched = first_stop(text, stop)
    return (text[: text.find(matched)], matched) if matched else (text, None)


def first_stop(text: str, stop: str | Sequence[str] | None) -> str | None:
    """Return the stop sequence that occurs earliest in ``text``, if any.

    Of sequences that start at the same place the shortest wins: generated token by
    token, it is the one completed first.
    """
    sequences = [stop] if isinstance(stop, str) else list(stop or ())
    found = [(text.find(seq), len(seq), seq) for seq in sequences if seq and seq in text]
    return min(found)[2] if found else None


def reasoning_size(params: dict[str, Any], target: RouteTarget) -> int:
    """Return how many reasoning tokens a choice thinks for on ``target``."""
    if "reasoning" not in target.capabilities:
        return 0
    effort = params.get("reasoning_effort") or DEFAULT_REASONING_EFFORT
    return REASONING_TOKENS.get(effort, REASONING_TOKENS[DEFAULT_REASONING_EFFORT])


def reasoning_trace(size: int, rng: random.Random) -> list[str]:
    """Write a reasoning trace of exactly ``size`` tokens, as its tokens."""
    tokens = ["Considering", " the", " request"][:size]
    while len(tokens) < size - 1:
        # A period never lands in the last two slots, so the trace never ends in "..".
        if tokens[-1] != "." and len(tokens) < size - 2 and rng.random() < 0.15:
            tokens.append(".")
        else:
            word = rng.choice(VOCABULARY)
            tokens.append(" " + (word.capitalize() if tokens[-1] == "." else word))
    if len(tokens) < size:
        tokens.append(".")
    return tokens


def tool_name(tool: dict[str, Any]) -> str:
    """Return the function name a tool declares ("" when it has none)."""
    return (tool.get("function") or {}).get("name") or ""


def select_tools(params: dict[str, Any], messages: Sequence[dict[str, Any]]) -> list[dict]:
    """Pick the tools a choice calls, by tool_choice and the tool names the user mentions."""
    tools = [tool for tool in params.get("tools") or () if tool_name(tool)]
    choice = params.get("tool_choice") or "auto"
    if not tools or choice == "none":
        return []
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        selected = [tool for tool in tools if tool_name(tool) == wanted][:1]
    else:
        selected = mentioned_tools(tools, messages, required=choice == "required")
    return selected[:1] if params.get("parallel_tool_calls") is False else selected


def mentioned_tools(
    tools: list[dict], messages: Sequence[dict[str, Any]], *, required: bool
) -> list[dict]:
    """Return the tools named in the last user message; required falls back to the first."""
    text = message_text(last_user_message(messages))
    mentioned = [tool for tool in tools if tool_name(tool) in text]
    if required:
        return mentioned or tools[:1]
    # Under "auto" only a fresh user turn triggers calls; after a tool result it answers.
    return mentioned if messages and messages[-1].get("role") == "user" else []


def logprob_entry(token: str, rng: random.Random, top: int) -> dict[str, Any]:
    """Invent the logprob of a generated token and its ``top`` most likely tokens, best first."""
    logprob = round(-rng.random(), 4) + 0.0  # + 0.0 turns -0.0 into 0.0
    entry = _token_logprob(token, logprob)
    entry["top_logprobs"] = [_token_logprob(token, logprob)] if top > 0 else []
    lead = token[: len(token) - len(token.lstrip())]
    candidates = [lead + word for word in VOCABULARY if lead + word != token]
    for alternative in rng.sample(candidates, min(max(top - 1, 0), len(candidates))):
        # Each step is under 0.2 and top_logprobs is at most 20, so values stay above -5.
        logprob = round(logprob - rng.uniform(0.01, 0.2), 4)
        entry["top_logprobs"].append(_token_logprob(alternative, logprob))
    return entry


def _token_logprob(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


@dataclass(frozen=True)
class ToolCallPlan:
    """One function call a choice makes, its arguments split into tokens."""

    id: str
    name: str
    argument_tokens: tuple[str, ...]

    @property
    def tokens(self) -> int:
        """Completion tokens of the call: its name and its arguments."""
        return count_tokens(self.name) + len(self.argument_tokens)

    def to_dict(self) -> dict[str, Any]:
        """Render in the contract's ToolCall shape."""
        arguments = "".join(self.argument_tokens)
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        }


def plan_tool_call(tool: dict[str, Any], rng: random.Random, words: Sequence[str]) -> ToolCallPlan:
    """Call ``tool`` with arguments generated from its parameters schema."""
    arguments = bounded_instance(tool_parameters(tool), words, "tools")
    return ToolCallPlan(
        id=f"call_{rng.getrandbits(96):024x}",
        name=tool["function"]["name"],
        argument_tokens=tuple(tokenize(json.dumps(arguments))),
    )


@dataclass(frozen=True)
class ChoicePlan:
    """Everything one choice says, as tokens, so that complete() and stream() agree."""

    index: int
    reasoning: list[str]
    content: list[str]
    tool_calls: list[ToolCallPlan]
    finish_reason: str
    logprobs: list[dict[str, Any]] | None
    # The caller's stop sequence the content was cut at, when that is why the choice ended.
    stop_sequence: str | None = None

    @property
    def completion_tokens(self) -> int:
        """Reasoning, content and tool-call tokens of the choice."""
        calls = sum(call.tokens for call in self.tool_calls)
        return len(self.reasoning) + len(self.content) + calls

    def to_choice(self) -> dict[str, Any]:
        """Render in the contract's Choice shape."""
        message = {
            "role": "assistant",
            "content": None if self.tool_calls else "".join(self.content),
            "refusal": None,
        }
        if self.reasoning:
            trace = "".join(self.reasoning)
            message["reasoning"] = trace
            message["reasoning_details"] = [
                {"type": "reasoning.text", "text": trace, "format": "builtin-v1", "index": 0}
            ]
        if self.tool_calls:
            message["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        logprobs = None if self.logprobs is None else {"content": self.logprobs, "refusal": None}
        return {
            "index": self.index,
            "message": message,
            "finish_reason": self.finish_reason,
            "logprobs": logprobs,
        }

    def stream_choices(self) -> Iterator[tuple[dict[str, Any], bool]]:
        """Yield the chunk choices of this choice, each with whether it carries a token."""
        yield self._delta({"role": "assistant", "content": ""}), False
        for token in self.reasoning:
            yield self._delta({"reasoning": token}), True
        for position, token in enumerate(self.content):
            choice = self._delta({"content": token})
            if self.logprobs is not None:
                choice["logprobs"] = {"content": [self.logprobs[position]]}
            yield choice, True
        for i, call in enumerate(self.tool_calls):
            yield from self._tool_call_choices(i, call)
        yield {"index": self.index, "delta": {}, "finish_reason": self.finish_reason}, False

    def _tool_call_choices(
        self, i: int, call: ToolCallPlan
    ) -> Iterator[tuple[dict[str, Any], bool]]:
        function = {"name": call.name, "arguments": ""}
        header = {"index": i, "id": call.id, "type": "function", "function": function}
        yield self._delta({"tool_calls": [header]}), False
        for piece in call.argument_tokens:
            arguments = {"index": i, "function": {"arguments": piece}}
            yield self._delta({"tool_calls": [arguments]}), True

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"index": self.index, "delta": delta, "finish_reason": None}


def limit_content(
    reasoning: list[str], content: list[str], limit: int | None
) -> tuple[list[str], list[str], str]:
    """Fit reasoning, then content, into ``limit`` tokens; return them and the finish reason."""
    if limit is None or len(reasoning) + len(content) <= limit:
        return reasoning, content, "stop"
    reasoning = reasoning[:limit]
    return reasoning, content[: limit - len(reasoning)], "length"


def limit_tool_calls(
    reasoning: list[str], calls: list[ToolCallPlan], limit: int | None
) -> tuple[list[str], list[ToolCallPlan], str]:
    """Fit reasoning, then the calls (names and arguments), into ``limit`` tokens."""
    if limit is None or len(reasoning) + sum(call.tokens for call in calls) <= limit:
        return reasoning, calls, "tool_calls"
    reasoning = reasoning[:limit]
    budget, kept = limit - len(reasoning), []
    for call in calls:
        # Names count too, so completion_tokens never exceeds the limit the hold was priced on.
        room = budget - count_tokens(call.name)
        if room < 0:
            break
        kept.append(replace(call, argument_tokens=call.argument_tokens[:room]))
        budget -= kept[-1].tokens
    return reasoning, kept, "length"


def plan_choice(
    request: ChatRequest, target: RouteTarget, prompt: Prompt, index: int
) -> ChoicePlan:
    """Decide everything choice ``index`` says, drawing from its own random stream."""
    params = request.params
    rng = choice_rng(params, index, prompt.digest)
    reasoning = reasoning_trace(reasoning_size(params, target), rng)
    limit = request.max_output_tokens or target.max_output_tokens
    words = prompt_words(request.messages)
    content: list[str] = []
    calls: list[ToolCallPlan] = []
    stop = None
    if tools := select_tools(params, request.messages):
        calls = [plan_tool_call(tool, rng, words) for tool in tools]
        reasoning, calls, finish = limit_tool_calls(reasoning, calls, limit)
    else:
        reply = reply_text(request.messages, rng)
        text, stop = cut_at_stop(
            format_content(reply, params.get("response_format"), words), params.get("stop")
        )
        reasoning, content, finish = limit_content(reasoning, tokenize(text), limit)
    logprobs = None
    if params.get("logprobs"):
        logprobs = [logprob_entry(token, rng, params.get("top_logprobs") or 0) for token in content]
    # A choice cut at its limit first never reached its stop sequence.
    stop = stop if finish == "stop" else None
    return ChoicePlan(index, reasoning, content, calls, finish, logprobs, stop)


def plan_choices(request: ChatRequest, target: RouteTarget, prompt: Prompt) -> list[ChoicePlan]:
    """Plan the ``n`` choices of a request."""
    return [plan_choice(request, target, prompt, index) for index in range(request.choice_count)]


def usage_of(prompt: Prompt, cached_tokens: int, plans: Sequence[ChoicePlan]) -> Usage:
    """Sum the usage of an answer: the prompt once, the completions of every choice."""
    return Usage(
        prompt_tokens=prompt.tokens,
        completion_tokens=sum(plan.completion_tokens for plan in plans),
        cached_tokens=min(cached_tokens, prompt.tokens - prompt.image_tokens),
        prompt_image_tokens=prompt.image_tokens,
        reasoning_tokens=sum(len(plan.reasoning) for plan in plans),
    )


class BuiltinAdapter(Adapter):
    """The offline development model: answers by the rules of docs/builtin-model.md.

    Upstream options: ``token_delay_seconds`` sleeps before each streamed chunk, and
    ``fail_after_tokens`` makes the upstream die after that many streamed tokens (and
    complete() fail outright), so tests can simulate slow and dying upstreams.
    """

    kind = "builtin"
    embeds = True

    def __init__(self, upstream: UpstreamConfig) -> None:
        super().__init__(upstream)
        options = upstream.options
        self.token_delay_seconds = float(options.get("token_delay_seconds") or 0)
        fail_after = options.get("fail_after_tokens")
        self.fail_after_tokens = None if fail_after is None else int(fail_after)
        # One cache per adapter, so per worker process: workers do not share what they saw.
        self.prompt_cache = PromptCache()

    def complete(self, request: ChatRequest, target: RouteTarget) -> Completion:
        """Answer the whole request at once."""
        if self.fail_after_tokens is not None:
            raise UpstreamError(FAILURE_MESSAGE)
        prompt = read_prompt(request, target)
        cached = self.prompt_cache.cached_tokens(prompt)
        plans = plan_choices(request, target, prompt)
        self.prompt_cache.remember(prompt)
        return Completion(
            choices=[plan.to_choice() for plan in plans],
            usage=usage_of(prompt, cached, plans),
            system_fingerprint=SYSTEM_FINGERPRINT,
            stop_sequence=plans[0].stop_sequence,
        )

    def stream(self, request: ChatRequest, target: RouteTarget) -> Iterator[Chunk]:
        """Yield the answer token by token, choice after choice, then one usage chunk."""
        prompt = read_prompt(request, target)
        cached = self.prompt_cache.cached_tokens(prompt)
        plans = plan_choices(request, target, prompt)
        tokens_sent = 0
        for plan in plans:
            for choice, carries_token in plan.stream_choices():
                if carries_token:
                    self._fail_if_spent(tokens_sent)
                    tokens_sent += 1
                self._pause()
                # Only the chunk that finishes the first choice names its stop sequence.
                stop = plan.stop_sequence if choice["finish_reason"] and plan.index == 0 else None
                yield Chunk(
                    choices=[choice], system_fingerprint=SYSTEM_FINGERPRINT, stop_sequence=stop
                )
        # A dying upstream never reports usage, even when the answer was shorter than the limit.
        if self.fail_after_tokens is not None:
            raise UpstreamError(FAILURE_MESSAGE)
        self.prompt_cache.remember(prompt)
        self._pause()
        yield Chunk(
            choices=[], usage=usage_of(prompt, cached, plans), system_fingerprint=SYSTEM_FINGERPRINT
        )

    def embed(self, request: EmbeddingRequest, target: RouteTarget) -> Embeddings:
        """Answer with each input's hashed-feature vector (hashed_vectors: not semantic).

        The usage is the inputs' tokens, as count_text_tokens counts them (token ids: one
        each), so a hold counted with this adapter is exact.
        """
        if self.fail_after_tokens is not None:
            raise UpstreamError(FAILURE_MESSAGE)
        dimensions = request.dimensions or NATIVE_DIMENSIONS
        if dimensions > NATIVE_DIMENSIONS:
            raise UpstreamRejected(
                f"dimensions must be at most {NATIVE_DIMENSIONS} for this model.",
                param="dimensions",
            )
        vectors, tokens = [], 0
        for item in request.inputs:
            pieces = (
                [token.strip().lower() for token in tokenize(item)]
                if type(item) is str
                else [str(token_id) for token_id in item]
            )
            tokens += len(pieces)
            vectors.append(Vector(values=array("f", hashed_vector(pieces, dimensions))))
        self._pause()
        return Embeddings(vectors=vectors, usage=Usage(prompt_tokens=tokens))

    def count_prompt_tokens(
        self, request: ChatRequest, target: RouteTarget, *, limit: int | None = None
    ) -> int:
        """Count the prompt tokens exactly as complete() and stream() report them.

        With ``limit``, a prompt whose text alone must pass it is not tokenized: every
        token holds at most WORD_TOKEN_CHARACTERS non-space characters.
        """
        if limit is not None and (least := least_prompt_tokens(request)) > limit:
            return least
        return read_prompt(request, target).tokens

    def prompt_token_bound(self, request: ChatRequest, target: RouteTarget) -> int:
        """Bound the prompt tokens by the prompt's size, without tokenizing it.

        It runs before credit is held, so it also refuses schemas too large to instantiate.
        """
        check_schema_instances(request)
        return prompt_token_bound(
            request, image_tokens=IMAGE_TOKENS, low_detail_image_tokens=LOW_DETAIL_IMAGE_TOKENS
        )

    def count_text_tokens(self, text: str, target: RouteTarget) -> int:
        """Count the tokens of generated text with the model's own tokenizer."""
        return count_tokens(text)

    def _fail_if_spent(self, tokens_sent: int) -> None:
        if tokens_sent == self.fail_after_tokens:
            raise UpstreamError(FAILURE_MESSAGE)

    def _pause(self) -> None:
        # time.sleep, looked up at call time, is the one gevent patches in production.
        if self.token_delay_seconds > 0:
            time.sleep(self.token_delay_seconds)
