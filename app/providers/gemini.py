"""Google's Gemini API (Generative Language API, ``v1beta``), by translation both ways.

Out: system messages become ``systemInstruction``; the other messages become ``contents``
(the assistant's role is ``model``; neighbouring turns of one role merge), images inline
data or file URIs, tool calls ``functionCall`` parts and tool results ``functionResponse``
parts (named after the call they answer); tools become ``functionDeclarations`` with their
JSON Schema as it came (``parametersJsonSchema``); the output limit, sampling, stop
sequences, JSON output and ``reasoning_effort`` (a thinking budget) go in
``generationConfig``. Back: text, thought summaries (``reasoning``, and
``reasoning_details`` keeping a thought's ``thoughtSignature``), function calls (with ids
made up when Gemini sends none), finish reasons and usage: the prompt counts cache reads,
the completion counts thoughts.

Thought signatures on the way back: the doors' requests carry no signature (their
schemas keep none), so an earlier turn's function call goes back with the signature
Google documents for calls whose own is not at hand (``SKIPPED_SIGNATURE``); without one
Gemini 3 refuses the conversation. Requests the Gemini door passes through (``relay``) go
on as sent, their signatures with them.

Embedding models are called at ``:batchEmbedContents``, one request per input (text
only: Gemini takes no token ids), with the task type, titles and vector size asked for.
Google's answer reports ``usageMetadata.promptTokenCount`` on its current models; an
answer without it is billed at the inputs counted, marked estimated.
"""

from __future__ import annotations

import logging
import mimetypes
import re
import secrets
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from app.encoding import dumps, loads
from app.providers.anthropic import text_of
from app.providers.base import (
    ChatRequest,
    Chunk,
    Completion,
    EmbeddingRequest,
    Embeddings,
    NativeCall,
    PromptContent,
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
from app.providers.event_stream import ServerSentEvent, json_object, read_events
from app.providers.http1 import UpstreamResponse
from app.providers.transport import (
    EXCHANGE_ERRORS,
    HttpUpstreamAdapter,
    as_count,
    prepared_url,
    received_chunks,
    release_response,
)
from app.providers.vectors import Vector, from_numbers

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
API_VERSION = "v1beta"
API_KEY_HEADER = "x-goog-api-key"
# The model names that already say their collection; any other is one of ``models/``.
MODEL_COLLECTIONS = ("models/", "tunedModels/")
FINISH_REASONS = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "IMAGE_RECITATION": "content_filter",
}
# What an answer Gemini blocked whole (``promptFeedback.blockReason``, no candidate) ends as.
BLOCKED = "content_filter"
# Thinking tokens per effort (``thinkingBudget``, which Gemini 2.5 and 3 both read); at most
# three quarters of the output limit, which counts the thoughts too.
THINKING_BUDGETS = {"none": 0, "minimal": 512, "low": 2048, "medium": 8192, "high": 24576}
# The smallest budget every thinking model takes (Gemini 2.5 Pro's).
MIN_THINKING_BUDGET = 128
# The signature Google documents for a function call whose own signature is not at hand.
SKIPPED_SIGNATURE = "skip_thought_signature_validator"
REASONING_FORMAT = "google-gemini-v1"
TOOL_CHOICE_MODES = {"none": "NONE", "auto": "AUTO", "required": "ANY"}
# Ids the gateway gives function calls Gemini sent without one; never sent back to it.
MADE_UP_ID_PREFIX = "call_gm_"
# A 400 that is the operator's to fix, not the caller's: a wrong key, an unserved region.
MISCONFIGURED_REASONS = frozenset({"API_KEY_INVALID", "API_KEY_EXPIRED"})
MISCONFIGURED_STATUSES = frozenset({"FAILED_PRECONDITION", "PERMISSION_DENIED", "UNAUTHENTICATED"})
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
BATCH_EMBED = "batchEmbedContents"
SECONDS = re.compile(r"^(\d+(?:\.\d+)?)s$")


def model_name(model: str) -> str:
    """Return a model's resource name, as Google's bodies name it (``models/ID``)."""
    return model if model.startswith(MODEL_COLLECTIONS) else f"models/{model}"


def model_path(model: str, method: str) -> str:
    """Return the path of ``method`` on ``model`` below the base URL."""
    return f"/{API_VERSION}/{model_name(model)}:{method}"


def system_instruction(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Join the system (and developer) messages, wherever they stand, into one instruction."""
    texts = [text_of(m.get("content")) for m in messages if m["role"] == "system"]
    text = "\n\n".join(text for text in texts if text)
    return {"parts": [{"text": text}]} if text else None


def image_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """Translate an image part: a base64 ``data:`` URI inline, an http(s) URL as a file URI."""
    url = part["image_url"]["url"]
    if url.startswith(("http://", "https://")):
        media_type = mimetypes.guess_type(url.split("?", 1)[0])[0]
        return {"fileData": {"fileUri": url, **({"mimeType": media_type} if media_type else {})}}
    header, _, data = url.partition(",")
    media_type, _, encoding = header.removeprefix("data:").partition(";")
    if not header.startswith("data:") or encoding != "base64" or not data or not media_type:
        raise UpstreamRejected(
            "An image must be an http(s) URL or a base64 data: URI for this model.",
            param=f"{where}.image_url.url",
        )
    return {"inlineData": {"mimeType": media_type, "data": data}}


def content_parts(content: Any, where: str) -> list[dict[str, Any]]:
    """Translate a message's content into text and image parts (empty texts dropped)."""
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts = []
    for index, part in enumerate(content or ()):
        if part.get("type") == "image_url":
            parts.append(image_part(part, f"{where}.content[{index}]"))
        elif part.get("text"):
            parts.append({"text": part["text"]})
    return parts


def call_arguments(call: dict[str, Any], where: str) -> dict[str, Any]:
    """Return an earlier tool call's arguments, which must be a JSON object."""
    try:
        arguments = loads(call["function"]["arguments"] or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise UpstreamRejected(
            "Tool call arguments must be a JSON object for this model.",
            param=f"{where}.function.arguments",
        )
    return arguments


def with_gemini_id(body: dict[str, Any], call_id: Any) -> dict[str, Any]:
    """Add a call's id to a functionCall or functionResponse, unless the gateway made it up."""
    if isinstance(call_id, str) and call_id and not call_id.startswith(MADE_UP_ID_PREFIX):
        body["id"] = call_id
    return body


def function_call_parts(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Translate an assistant's tool calls; the first carries the turn's thought signature."""
    parts = []
    for index, call in enumerate(message.get("tool_calls") or ()):
        arguments = call_arguments(call, f"{where}.tool_calls[{index}]")
        body = {"name": call["function"]["name"], "args": arguments}
        part: dict[str, Any] = {"functionCall": with_gemini_id(body, call.get("id"))}
        if index == 0:
            part["thoughtSignature"] = SKIPPED_SIGNATURE
        parts.append(part)
    return parts


def function_response_part(message: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """Translate a tool message: the result's text, named after the call it answers."""
    call_id = message["tool_call_id"]
    body = {"name": names.get(call_id, ""), "response": {"result": text_of(message.get("content"))}}
    return {"functionResponse": with_gemini_id(body, call_id)}


def turn_of(
    message: dict[str, Any], names: Mapping[str, str], where: str
) -> tuple[str, list[dict[str, Any]]]:
    """Translate one non-system message into a (role, parts) turn."""
    role = message["role"]
    if role == "tool":
        return "user", [function_response_part(message, names)]
    parts = content_parts(message.get("content"), where)
    if role == "assistant":
        return "model", parts + function_call_parts(message, where)
    return "user", parts


def gemini_contents(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Translate the conversation, merging neighbouring turns of the same role."""
    names = {
        call["id"]: call["function"]["name"]
        for message in messages
        for call in message.get("tool_calls") or ()
    }
    contents: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if message["role"] == "system":
            continue
        role, parts = turn_of(message, names, f"messages[{index}]")
        if not parts:
            continue
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    return contents


def function_declarations(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Translate function tools, their parameters as the JSON Schema they came in."""
    declarations = []
    for tool in tools:
        function = tool["function"]
        declaration = {"name": function["name"]}
        if function.get("description"):
            declaration["description"] = function["description"]
        if function.get("parameters"):
            declaration["parametersJsonSchema"] = function["parameters"]
        declarations.append(declaration)
    return declarations


def tool_config(choice: Any) -> dict[str, Any] | None:
    """Translate tool_choice (None: leave the API's default, AUTO)."""
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
    if choice in TOOL_CHOICE_MODES:
        return {"functionCallingConfig": {"mode": TOOL_CHOICE_MODES[choice]}}
    return None


def thinking_config(
    request: ChatRequest, target: RouteTarget, max_tokens: int | None
) -> dict[str, Any] | None:
    """Return the thinking ``reasoning_effort`` asks for; None leaves the model's default.

    A model without the reasoning capability is sent none, nor is an output limit too
    small for the smallest budget. Thoughts are asked for with their summaries, so that
    the answer shows its reasoning as the other upstreams do.
    """
    effort = request.params.get("reasoning_effort")
    if effort not in THINKING_BUDGETS or "reasoning" not in target.capabilities:
        return None
    if effort == "none":
        return {"thinkingBudget": 0}
    budget = THINKING_BUDGETS[effort]
    if max_tokens is not None:
        budget = min(budget, max_tokens * 3 // 4)
    if budget < MIN_THINKING_BUDGET:
        return None
    return {"thinkingBudget": budget, "includeThoughts": True}


def generation_config(request: ChatRequest, target: RouteTarget) -> dict[str, Any]:
    """Build ``generationConfig``: the output limit, sampling, stops, JSON output, thinking."""
    params = request.params
    config: dict[str, Any] = {}
    max_tokens = request.max_output_tokens or target.max_output_tokens
    if max_tokens:
        config["maxOutputTokens"] = max_tokens
    for name, key in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        if params.get(name) is not None:
            config[key] = params[name]
    if stop := params.get("stop"):
        config["stopSequences"] = [stop] if isinstance(stop, str) else stop
    config.update(response_format(params.get("response_format")))
    if thinking := thinking_config(request, target, max_tokens):
        config["thinkingConfig"] = thinking
    return config


def response_format(format_: Any) -> dict[str, Any]:
    """Translate response_format: JSON output, to the caller's schema when it gives one."""
    kind = format_.get("type") if isinstance(format_, dict) else None
    if kind == "json_object":
        return {"responseMimeType": "application/json"}
    if kind == "json_schema":
        schema = (format_.get("json_schema") or {}).get("schema")
        config = {"responseMimeType": "application/json"}
        return {**config, "responseJsonSchema": schema} if schema is not None else config
    return {}


def generate_request(request: ChatRequest, target: RouteTarget) -> dict[str, Any]:
    """Build the body of POST .../models/{model}:generateContent (or its stream)."""
    if request.choice_count > 1:
        raise UpstreamRejected("This model returns one choice per request.", param="n")
    body: dict[str, Any] = {"contents": gemini_contents(request.messages)}
    if instruction := system_instruction(request.messages):
        body["systemInstruction"] = instruction
    if tools := request.params.get("tools"):
        body["tools"] = [{"functionDeclarations": function_declarations(tools)}]
        if config := tool_config(request.params.get("tool_choice")):
            body["toolConfig"] = config
    if config := generation_config(request, target):
        body["generationConfig"] = config
    body.update((k, v) for k, v in request.extra.items() if k in target.extra_params)
    return body


def usage_from(metadata: Any) -> Usage:
    """Read ``usageMetadata``: the prompt counts its cache reads, the completion its thoughts.

    ``promptTokenCount`` includes ``cachedContentTokenCount``; ``toolUsePromptTokenCount``
    (what a tool's results added to the prompt) is input Google bills beside it;
    ``candidatesTokenCount`` leaves out ``thoughtsTokenCount``, which is output too.
    """
    if type(metadata) is not dict:
        return Usage()
    prompt = as_count(metadata.get("promptTokenCount")) + as_count(
        metadata.get("toolUsePromptTokenCount")
    )
    thoughts = as_count(metadata.get("thoughtsTokenCount"))
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=as_count(metadata.get("candidatesTokenCount")) + thoughts,
        cached_tokens=min(as_count(metadata.get("cachedContentTokenCount")), prompt),
        reasoning_tokens=thoughts,
    )


def reported_usage(response: dict[str, Any]) -> Usage | None:
    """Return the usage a response reports, or None when it reports no prompt count."""
    metadata = response.get("usageMetadata")
    if type(metadata) is not dict or not as_count(metadata.get("promptTokenCount")):
        return None
    return usage_from(metadata)


def finish_reason_of(reason: Any, called: bool) -> str | None:
    """Map a candidate's ``finishReason``; an answer that called functions ends in tool_calls.

    Gemini ends an answer that calls functions with STOP, as any other.
    """
    if not isinstance(reason, str) or not reason:
        return None
    if called and reason == "STOP":
        return "tool_calls"
    return FINISH_REASONS.get(reason, "stop")


def first_candidate(response: dict[str, Any]) -> dict[str, Any] | None:
    """Return the answer's candidate (one is asked for), or None when it has none."""
    candidates = response.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
        return candidates[0]
    return None


def parts_of(candidate: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Return a candidate's content parts (none when it has no content)."""
    content = candidate.get("content") if candidate else None
    parts = content.get("parts") if isinstance(content, dict) else None
    return [part for part in parts if isinstance(part, dict)] if isinstance(parts, list) else []


def blocked(response: dict[str, Any]) -> bool:
    """Tell whether Gemini refused the prompt itself (``promptFeedback.blockReason``)."""
    feedback = response.get("promptFeedback")
    return isinstance(feedback, dict) and bool(feedback.get("blockReason"))


def made_up_id() -> str:
    """Return an id for a function call Gemini sent without one."""
    return MADE_UP_ID_PREFIX + secrets.token_hex(12)


def tool_call_of(call: dict[str, Any]) -> dict[str, Any]:
    """Translate a ``functionCall`` into the contract's ToolCall."""
    call_id = call.get("id")
    return {
        "id": call_id if isinstance(call_id, str) and call_id else made_up_id(),
        "type": "function",
        "function": {
            "name": str(call.get("name") or ""),
            "arguments": dumps(call.get("args") or {}).decode(),
        },
    }


def thought_detail(part: dict[str, Any], index: int) -> dict[str, Any]:
    """Translate a thought part into a reasoning_details entry, its signature kept."""
    detail = {"type": "reasoning.text", "text": part.get("text") or ""}
    if isinstance(part.get("thoughtSignature"), str):
        detail["signature"] = part["thoughtSignature"]
    return {**detail, "format": REASONING_FORMAT, "index": index}


def message_from(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Translate a candidate's parts into the contract's ResponseMessage."""
    texts = [p.get("text") or "" for p in parts if not p.get("thought") and "text" in p]
    thoughts = [thought_detail(p, i) for i, p in enumerate(parts) if p.get("thought")]
    calls = [
        tool_call_of(p["functionCall"]) for p in parts if isinstance(p.get("functionCall"), dict)
    ]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
        "refusal": None,
    }
    if thoughts:
        message["reasoning"] = "".join(detail["text"] for detail in thoughts) or None
        message["reasoning_details"] = thoughts
    if calls:
        message["tool_calls"] = calls
    return message


def error_of(body: Any) -> dict[str, Any]:
    """Return the ``error`` object of Google's error envelope ({} when there is none)."""
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


def error_reasons(error: dict[str, Any]) -> set[str]:
    """Return the ``reason`` of each ErrorInfo among an error's details."""
    details = error.get("details")
    details = details if isinstance(details, list) else []
    return {
        detail["reason"]
        for detail in details
        if isinstance(detail, dict) and isinstance(detail.get("reason"), str)
    }


def retry_delay(error: dict[str, Any]) -> float | None:
    """Return the wait a RetryInfo among an error's details asks for (``"37s"``), if any."""
    details = error.get("details")
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, dict) and detail.get("@type") == RETRY_INFO:
            match = SECONDS.match(str(detail.get("retryDelay", "")))
            return float(match.group(1)) if match else None
    return None


def stream_error(error: dict[str, Any]) -> UpstreamError:
    """Map an error sent in place of a stream's next chunk to the gateway's error."""
    status = error.get("status")
    log.warning("gemini upstream error mid-stream: %s", status)
    if status in ("RESOURCE_EXHAUSTED", "UNAVAILABLE"):
        return UpstreamUnavailable()
    if status == "DEADLINE_EXCEEDED":
        return UpstreamTimeout()
    return UpstreamError("The model's upstream failed mid-answer.")


class StreamTranslation:
    """Turns one Gemini event stream into OpenAI-shaped chunks, keeping what it needs.

    Each event is a whole GenerateContentResponse holding the parts generated since the
    last; a function call comes whole, in one part. Its ``usageMetadata`` is the running
    total: each chunk carries it, so that a stream that breaks off is billed its prompt.
    """

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self.usage: Usage | None = None
        self.calls = 0
        self.thought_index = 0
        self.started = False
        self.finished = False
        # The last chunk relayed said more, and no chunk since has ended its read.
        self.held = False

    def relay(self, event: ServerSentEvent) -> Chunk | None:
        """Return the chunk to relay for ``event``; raise on an error in its place."""
        payload = json_object(event.data)
        if error := error_of(payload):
            raise stream_error(error)
        self.usage = reported_usage(payload) or self.usage
        delta, reason = self.delta_of(payload)
        if delta or reason:
            chunk = Chunk(
                choices=[{"index": 0, "delta": delta, "finish_reason": reason}],
                usage=self.usage,
                system_fingerprint=self.fingerprint,
                more=event.more,
            )
            self.held = event.more
            return chunk
        if self.held and not event.more:
            # The read ends on an event without parts: what came before it goes now.
            self.held = False
            return Chunk(choices=[], system_fingerprint=self.fingerprint)
        return None

    def delta_of(self, payload: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """Return the delta of one response's parts, and its finish reason if it has one."""
        candidate = first_candidate(payload)
        delta: dict[str, Any] = {}
        texts, thoughts, details, calls = [], [], [], []
        for part in parts_of(candidate):
            if part.get("thought"):
                thoughts.append(part.get("text") or "")
                details.append(thought_detail(part, self.thought_index))
                self.thought_index += 1
            elif isinstance(part.get("functionCall"), dict):
                call = {"index": self.calls + len(calls), **tool_call_of(part["functionCall"])}
                calls.append(call)
            elif isinstance(part.get("text"), str) and part["text"]:
                texts.append(part["text"])
        if not self.started:
            self.started = True
            delta["role"] = "assistant"
        if thoughts:
            delta["reasoning"] = "".join(thoughts)
            delta["reasoning_details"] = details
        if texts or "role" in delta:
            delta["content"] = "".join(texts)
        if calls:
            self.calls += len(calls)
            delta["tool_calls"] = calls
        reason = finish_reason_of((candidate or {}).get("finishReason"), self.calls > 0)
        if reason is None and blocked(payload):
            reason = BLOCKED
        self.finished = self.finished or reason is not None
        return delta, reason


def embed_requests(request: EmbeddingRequest, model: str) -> list[dict[str, Any]]:
    """Build batchEmbedContents' ``requests``: one per input, with the request's options."""
    if request.token_arrays:
        raise UpstreamRejected("This model embeds text, not token ids.", param="input")
    name, titles = model_name(model), request.titles or (None,) * len(request.inputs)
    requests = []
    for text, title in zip(request.texts, titles, strict=True):
        item: dict[str, Any] = {"model": name, "content": {"parts": [{"text": text}]}}
        if request.task_type is not None:
            item["taskType"] = request.task_type
        if title is not None:
            item["title"] = title
        if request.dimensions is not None:
            item["outputDimensionality"] = request.dimensions
        requests.append(item)
    return requests


def embedding_vectors(embeddings: Any, count: int) -> list[Vector]:
    """Return the vectors of a batchEmbedContents answer: one per input, in their order."""
    if not isinstance(embeddings, list) or len(embeddings) != count:
        raise UpstreamError("The model's upstream answered without one vector per input.")
    vectors = []
    for item in embeddings:
        vector = from_numbers(item.get("values") if isinstance(item, dict) else None)
        if vector is None:
            raise UpstreamError("The model's upstream answered a vector the gateway cannot read.")
        vectors.append(vector)
    return vectors


class GeminiAdapter(HttpUpstreamAdapter):
    """Calls ``{base_url}/v1beta/models/{model}:generateContent`` and its stream.

    A route that says ``api = "gemini"`` passes the Gemini door's requests through
    (``relay``, ``relay_stream``): the caller's body as sent, to the route's model.
    """

    kind = "gemini"
    embeds = True
    default_base_url: ClassVar[str | None] = DEFAULT_BASE_URL
    # Gemini has ``mediaResolution``, not ``detail``: a low-detail image is billed in full.
    low_detail_image_tokens = None

    def __init__(self, upstream: UpstreamConfig) -> None:
        super().__init__(upstream)
        self.base_url = (upstream.base_url or DEFAULT_BASE_URL).rstrip("/")
        self.urls: dict[tuple[str, bool | str], str] = {}

    def url(self, model: str, *, stream: bool) -> str:
        """Return the prepared URL of a model's whole or streamed generation (kept per model)."""
        key = (model, stream)
        if key not in self.urls:
            method = "streamGenerateContent?alt=sse" if stream else "generateContent"
            self.urls[key] = prepared_url(self.base_url + model_path(model, method))
        return self.urls[key]

    def headers(self) -> dict[str, str]:
        """Return the request headers, with the key in Google's header if the upstream has one."""
        headers = {"Content-Type": "application/json"}
        if key := self.api_key():
            headers[API_KEY_HEADER] = key
        return headers

    def call(
        self, body: dict[str, Any], target: RouteTarget, public_model: str, *, stream: bool
    ) -> UpstreamResponse:
        """Send ``body`` to the route's model; return the upstream's successful response."""
        return self.post(
            self.url(target.upstream_model, stream=stream),
            body,
            self.headers(),
            stream=stream,
            public_model=public_model,
            upstream_model=target.upstream_model,
        )

    def complete(self, request: ChatRequest, target: RouteTarget) -> Completion:
        """Ask for the whole answer and translate it back."""
        response = self.call(generate_request(request, target), target, request.model, stream=False)
        body = self.read_json(response)
        candidate = first_candidate(body)
        if candidate is None and not blocked(body):
            raise UpstreamError("The model's upstream answered without a candidate.")
        message = message_from(parts_of(candidate))
        reason = finish_reason_of((candidate or {}).get("finishReason"), "tool_calls" in message)
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": reason or (BLOCKED if candidate is None else "stop"),
            "logprobs": None,
        }
        return Completion(
            choices=[choice],
            usage=reported_usage(body) or self.estimate_usage(request, target, message),
            system_fingerprint=self.fingerprint(target),
        )

    def stream(self, request: ChatRequest, target: RouteTarget) -> Iterator[Chunk]:
        """Relay the translated events as they arrive, then the usage."""
        response = self.call(generate_request(request, target), target, request.model, stream=True)
        translation = StreamTranslation(self.fingerprint(target))
        complete = False
        try:
            # Each event is relayed by a call, not in this loop's body, whose variables
            # would keep the last event for as long as the stream waits for the next.
            for chunk in map(translation.relay, read_events(received_chunks(response))):
                if chunk is not None:
                    yield chunk
            # The body's end ends the stream (usage may follow the finish reason).
            if not translation.finished:
                raise UpstreamError("The model's upstream ended the answer early.")
            complete = True
            # Without usage, the gateway bills what the stream delivered, counted; the
            # chunk also sends what a read left held.
            yield Chunk(
                choices=[], usage=translation.usage, system_fingerprint=translation.fingerprint
            )
        finally:
            # Also when the caller went away: the upstream stops generating at once.
            release_response(response, complete=complete)

    def embed(self, request: EmbeddingRequest, target: RouteTarget) -> Embeddings:
        """Ask batchEmbedContents for the inputs' vectors; count them if it reports no usage."""
        model = target.upstream_model
        key = (model, BATCH_EMBED)
        if key not in self.urls:
            self.urls[key] = prepared_url(self.base_url + model_path(model, BATCH_EMBED))
        response = self.post(
            self.urls[key],
            {"requests": embed_requests(request, model)},
            self.headers(),
            stream=False,
            public_model=request.model,
            upstream_model=model,
        )
        answer = self.read_json(response)
        vectors = embedding_vectors(answer.get("embeddings"), len(request.inputs))
        metadata = answer.get("usageMetadata")
        tokens = as_count(metadata.get("promptTokenCount")) if isinstance(metadata, dict) else 0
        if tokens:
            return Embeddings(vectors=vectors, usage=Usage(prompt_tokens=tokens))
        content = PromptContent(texts=request.texts + request.title_texts)
        usage = Usage(prompt_tokens=self.count_content_tokens(content, target), estimated=True)
        return Embeddings(vectors=vectors, usage=usage)

    def post_native(
        self, call: NativeCall, target: RouteTarget, *, stream: bool
    ) -> UpstreamResponse:
        """Send the caller's Gemini body as it came; the route's model is in the path.

        A stream is asked for as server-sent events (``alt=sse``), one response each.
        """
        public_model = call.model or target.upstream_model
        return self.call(dict(call.body), target, public_model, stream=stream)

    def status_error(self, response: UpstreamResponse, names: tuple[str, str]) -> Exception:
        """Map Google's error statuses: a 400 that refuses the key is the operator's to fix.

        A 429's wait comes in the body (RetryInfo), not in a header.
        """
        status = response.status
        if status not in (400, 429):
            return super().status_error(response, names)
        try:
            # A stream's error body is read here, the whole answer's already was.
            error = error_of(loads(response.read()))
        except (ValueError, *EXCHANGE_ERRORS):
            error = {}
        if status == 429:
            log.warning("upstream %s answered 429 %s", self.upstream.name, error.get("status"))
            return UpstreamUnavailable(retry_after=retry_delay(error))
        if error_reasons(error) & MISCONFIGURED_REASONS or error.get("status") in (
            MISCONFIGURED_STATUSES
        ):
            # Its message may quote the key: logged by name only.
            log.error(
                "upstream %s refused the gateway (400 %s): check its key",
                self.upstream.name,
                error.get("status"),
            )
            return UpstreamMisconfigured()
        return self.rejection(response, names)

    def estimate_usage(
        self, request: ChatRequest, target: RouteTarget, message: dict[str, Any]
    ) -> Usage:
        """Count the usage of a whole answer whose upstream reported none."""
        reasoning = self.count_text_tokens(message.get("reasoning") or "", target)
        completion = reasoning + self.count_text_tokens(message.get("content") or "", target)
        for call in message.get("tool_calls") or ():
            function = call["function"]
            completion += self.count_text_tokens(function["name"], target)
            completion += self.count_text_tokens(function["arguments"], target)
        return Usage(
            prompt_tokens=self.count_prompt_tokens(request, target),
            completion_tokens=completion,
            reasoning_tokens=reasoning,
            estimated=True,
        )

    def fingerprint(self, target: RouteTarget) -> str:
        """Return the system_fingerprint of this model's answers: Gemini sends none."""
        return fingerprint_of(self.kind, self.upstream.name, target.upstream_model)
