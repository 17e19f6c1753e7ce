"""An OpenAI-compatible upstream that answers at once from precomputed bytes.

It is the upstream of every benchmark target, so it must never be the bottleneck: one
asyncio process, raw HTTP/1.1 with keep-alive, no JSON decoding (the answer is chosen by
looking for the model's name in the body), responses built once at start. The model
name picks the behaviour:

- ``bench-fast``: the whole answer, or a stream of ``CHUNKS`` content chunks, usage and
  ``[DONE]`` in one write;
- ``bench-slow``: the same after ``SLOW_SECONDS`` (a remote model's time to answer);
- ``bench-drip``: the same stream, each chunk in a write of its own, ``DRIP_SECONDS``
  apart, as a model sends its tokens while it generates them: every event a read of
  its own at the other end;
- ``bench-trickle``: a stream that sends one chunk now and one every ``TRICKLE_SECONDS``
  until ``TRICKLE_CHUNKS`` were sent or the caller hangs up (the memory benchmark);
- ``bench-native``: the same answer in OpenAI's Responses API, as its /v1/responses
  sends it (a route passes requests through to it): the Response object, or a stream of
  its events (``CHUNKS`` text deltas), in one write;
- ``bench-claude``: the same answer in Anthropic's Messages API, as its /v1/messages
  sends it (a route passes Messages requests through to it): the Message, or a stream
  of its events (``CHUNKS`` text deltas), in one write;
- ``bench-embed``: an embeddings answer as OpenAI's /v1/embeddings sends it:
  ``EMBED_INPUTS`` vectors of ``EMBED_DIMENSIONS`` dimensions, as base64 of float32 when
  the request asks for base64, else as numbers, in one write.

    python bench/fake_upstream.py --port 9100
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import resource
import struct

CHUNKS = 20
SLOW_SECONDS = 0.05
DRIP_SECONDS = 0.001
TRICKLE_SECONDS = 10.0
TRICKLE_CHUNKS = 120
PROMPT_TOKENS, COMPLETION_TOKENS = 12, CHUNKS
USAGE = {
    "prompt_tokens": PROMPT_TOKENS,
    "completion_tokens": COMPLETION_TOKENS,
    "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
}
WORDS = [f" word{index}" for index in range(CHUNKS)]
# An embeddings request of bench/instructions.py: its inputs, and the size of OpenAI's
# text-embedding-3-small vectors.
EMBED_INPUTS, EMBED_DIMENSIONS, EMBED_TOKENS = 16, 1536, 160


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def whole_answer() -> bytes:
    """Return the HTTP response of a non-streamed completion."""
    body = _compact(
        {
            "id": "chatcmpl-upstream",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "upstream-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(WORDS)},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": USAGE,
        }
    )
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def stream_head() -> bytes:
    """Return the status line and headers of a chunked event stream."""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )


def http_chunk(event: bytes) -> bytes:
    """Frame one HTTP chunk of the body."""
    return b"%x\r\n%s\r\n" % (len(event), event)


def stream_event(index: int, *, finish: bool = False) -> bytes:
    """Return the ``index``-th content chunk as one SSE event."""
    delta = {"content": WORDS[index % CHUNKS]}
    if index == 0:
        delta["role"] = "assistant"
    chunk = {
        "id": "chatcmpl-upstream",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "upstream-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if finish else None}],
    }
    return b"data: " + _compact(chunk) + b"\n\n"


def stream_end() -> bytes:
    """Return the usage event, ``[DONE]`` and the body's last chunk."""
    usage = {
        "id": "chatcmpl-upstream",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "upstream-model",
        "choices": [],
        "usage": USAGE,
    }
    return (
        http_chunk(b"data: " + _compact(usage) + b"\n\n")
        + http_chunk(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )


def whole_stream() -> bytes:
    """Return a complete streamed answer: every chunk, usage and ``[DONE]``."""
    events = b"".join(
        http_chunk(stream_event(index, finish=index == CHUNKS - 1)) for index in range(CHUNKS)
    )
    return stream_head() + events + stream_end()


def response_object(status: str) -> dict:
    """Return the Responses API's Response object of the answer, in ``status``."""
    completed = status == "completed"
    text = {"type": "output_text", "annotations": [], "logprobs": [], "text": "".join(WORDS)}
    message = {"id": "msg_upstream", "type": "message", "status": "completed",
               "content": [text], "role": "assistant"}  # fmt: skip
    usage = {
        "input_tokens": PROMPT_TOKENS,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": COMPLETION_TOKENS,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
    }
    return {
        "id": "resp_upstream", "object": "response", "created_at": 1700000000,
        "status": status, "error": None, "incomplete_details": None, "model": "upstream-model",
        "output": [message] if completed else [], "usage": usage if completed else None,
        "parallel_tool_calls": True, "store": False, "tool_choice": "auto", "tools": [],
    }  # fmt: skip


def responses_whole() -> bytes:
    """Return the HTTP response of a whole Responses API answer."""
    body = _compact(response_object("completed"))
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def responses_stream() -> bytes:
    """Return a complete Responses API stream: its events, each in an HTTP chunk."""
    text = "".join(WORDS)
    item = {"id": "msg_upstream", "type": "message", "status": "in_progress", "content": [],
            "role": "assistant"}  # fmt: skip
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
    place = {"item_id": "msg_upstream", "output_index": 0, "content_index": 0}
    done = response_object("completed")
    events = [
        {"type": "response.created", "response": response_object("in_progress")},
        {"type": "response.in_progress", "response": response_object("in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **place, "part": part},
        *({"type": "response.output_text.delta", **place, "delta": word, "logprobs": []}
          for word in WORDS),
        {"type": "response.output_text.done", **place, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **place, "part": {**part, "text": text}},
        {"type": "response.output_item.done", "output_index": 0, "item": done["output"][0]},
        {"type": "response.completed", "response": done},
    ]  # fmt: skip
    chunks = b"".join(
        http_chunk(b"event: %s\ndata: %s\n\n" % (event["type"].encode(), _compact(
            {**event, "sequence_number": number})))
        for number, event in enumerate(events)
    )  # fmt: skip
    return stream_head() + chunks + b"0\r\n\r\n"


def anthropic_message() -> dict:
    """Return Anthropic's Message of the answer, with its usage."""
    usage = {"input_tokens": PROMPT_TOKENS, "cache_creation_input_tokens": 0,
             "cache_read_input_tokens": 0, "output_tokens": COMPLETION_TOKENS}  # fmt: skip
    return {
        "id": "msg_upstream", "type": "message", "role": "assistant", "model": "upstream-model",
        "content": [{"type": "text", "text": "".join(WORDS)}], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": usage,
    }  # fmt: skip


def messages_whole() -> bytes:
    """Return the HTTP response of a whole Messages API answer."""
    body = _compact(anthropic_message())
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def messages_stream() -> bytes:
    """Return a complete Messages API stream: its events, each in an HTTP chunk."""
    message = anthropic_message()
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**message["usage"], "output_tokens": 1}}  # fmt: skip
    events = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        *({"type": "content_block_delta", "index": 0,
           "delta": {"type": "text_delta", "text": word}} for word in WORDS),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": COMPLETION_TOKENS}},
        {"type": "message_stop"},
    ]  # fmt: skip
    chunks = b"".join(
        http_chunk(b"event: %s\ndata: %s\n\n" % (event["type"].encode(), _compact(event)))
        for event in events
    )
    return stream_head() + chunks + b"0\r\n\r\n"


def embeddings_whole(*, packed: bool) -> bytes:
    """Return the HTTP response of an embeddings answer: base64 (``packed``) or numbers."""
    vectors = [
        [round(((index * 7919 + position * 104729) % 2000 - 1000) / 31622.7766, 10)
         for position in range(EMBED_DIMENSIONS)]
        for index in range(EMBED_INPUTS)
    ]  # fmt: skip
    body = _compact(
        {
            "object": "list",
            "data": [
                {
                    "object": "embedding",
                    "index": index,
                    "embedding": base64_floats(vector) if packed else vector,
                }
                for index, vector in enumerate(vectors)
            ],
            "model": "upstream-embedding-model",
            "usage": {"prompt_tokens": EMBED_TOKENS, "total_tokens": EMBED_TOKENS},
        }
    )
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def base64_floats(vector: list[float]) -> str:
    """Return ``vector`` as base64 of little-endian float32, as OpenAI sends it."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


WHOLE, STREAM = whole_answer(), whole_stream()
EMBED_BASE64, EMBED_FLOATS = embeddings_whole(packed=True), embeddings_whole(packed=False)
NATIVE_WHOLE, NATIVE_STREAM = responses_whole(), responses_stream()
CLAUDE_WHOLE, CLAUDE_STREAM = messages_whole(), messages_stream()


class UpstreamProtocol(asyncio.Protocol):
    """One keep-alive connection: parse requests as bytes arrive, answer each."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        """Answer every complete request in the buffer, in order."""
        self.buffer += data
        while not self.busy:
            request = self._next_request()
            if request is None:
                return
            self._answer(request)

    def _next_request(self) -> bytes | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = self.buffer[: end + 2].lower()
        start = head.find(b"content-length:")
        length = int(head[start + 15 : head.find(b"\r\n", start)]) if start >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return None
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        return body

    def _answer(self, body: bytes) -> None:
        streamed = b'"stream":true' in body
        if b"bench-trickle" in body:
            self.busy = True
            asyncio.ensure_future(self._send_apart(TRICKLE_CHUNKS, TRICKLE_SECONDS))
        elif b"bench-drip" in body:
            self.busy = True
            asyncio.ensure_future(self._send_apart(CHUNKS, DRIP_SECONDS))
        elif b"bench-native" in body:
            self.transport.write(NATIVE_STREAM if streamed else NATIVE_WHOLE)
        elif b"bench-embed" in body:
            packed = b'"encoding_format":"base64"' in body
            self.transport.write(EMBED_BASE64 if packed else EMBED_FLOATS)
        elif b"bench-claude" in body:
            self.transport.write(CLAUDE_STREAM if streamed else CLAUDE_WHOLE)
        elif b"bench-slow" in body:
            self.busy = True
            asyncio.get_running_loop().call_later(SLOW_SECONDS, self._send_later, streamed)
        else:
            self.transport.write(STREAM if streamed else WHOLE)

    def _send_later(self, streamed: bool) -> None:
        self.busy = False
        if not self.transport.is_closing():
            self.transport.write(STREAM if streamed else WHOLE)
            self.data_received(b"")

    async def _send_apart(self, chunks: int, seconds: float) -> None:
        self.transport.write(stream_head() + http_chunk(stream_event(0)))
        for index in range(1, chunks):
            await asyncio.sleep(seconds)
            if self.transport.is_closing():
                return
            last = index == chunks - 1
            self.transport.write(http_chunk(stream_event(index, finish=last)))
        self.transport.write(stream_end())
        self.busy = False
        self.data_received(b"")


async def serve(port: int) -> None:
    """Serve on 127.0.0.1:``port`` until killed."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    """Parse the port and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
