"""An OpenAI-compatible upstream for the fault run, in a process of its own.

The run stops it (SIGSTOP) and lets it go on (SIGCONT), so it is a separate process, and
it paces its streams so that faults land in the middle of them. The caller's last
message says how to answer, as ``name=number`` pairs anywhere in its text:

- ``chunks``: content chunks of a stream, or words of a whole answer (default 40);
- ``pause``: milliseconds between two chunks of a stream (default 40);
- ``delay``: milliseconds before a whole answer (default 0).

A request with ``tools`` is answered with one call of its first tool, whose arguments
come in ``chunks`` pieces. Every answer reports its usage (streams at the end, as asked
with ``stream_options.include_usage``).

    python tests/faults/upstream.py --port 9200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

PROMPT_TOKENS = 20
DIRECTIVE = re.compile(r"\b(chunks|pause|delay)=(\d+)\b")
DEFAULTS = {"chunks": 40, "pause": 40, "delay": 0}
CREATED = 1700000000


def directives(body: dict) -> dict[str, int]:
    """Return how to answer, read from the text of the request's last message."""
    messages = body.get("messages") or [{}]
    content = messages[-1].get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    return {**DEFAULTS, **{name: int(value) for name, value in DIRECTIVE.findall(text)}}


def tool_name(body: dict) -> str | None:
    """Return the name of the request's first tool, if it offers any."""
    tools = body.get("tools") or []
    return tools[0].get("function", {}).get("name", "tool") if tools else None


def usage(chunks: int) -> dict:
    """Return the usage of an answer of ``chunks`` pieces."""
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": chunks,
        "total_tokens": PROMPT_TOKENS + chunks,
    }


def encode(value: object) -> bytes:
    """Encode ``value`` as compact JSON."""
    return json.dumps(value, separators=(",", ":")).encode()


def whole_answer(chunks: int, tool: str | None) -> bytes:
    """Return the HTTP response of a non-streamed completion."""
    if tool is None:
        message = {"role": "assistant", "content": "".join(f" word{i}" for i in range(chunks))}
        finish = "stop"
    else:
        arguments = encode({"values": list(range(chunks))}).decode()
        function = {"name": tool, "arguments": arguments}
        call = {"id": "call_0", "type": "function", "function": function}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    body = encode(
        {
            "id": "chatcmpl-upstream",
            "object": "chat.completion",
            "created": CREATED,
            "model": "upstream-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage(chunks),
        }
    )
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def http_chunk(event: dict | str) -> bytes:
    """Frame one SSE event as one HTTP chunk."""
    data = b"data: " + (event.encode() if isinstance(event, str) else encode(event)) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def chunk_event(delta: dict, finish: str | None = None, *, with_usage: dict | None = None) -> dict:
    """Return one ``chat.completion.chunk``."""
    event = {
        "id": "chatcmpl-upstream",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": "upstream-model",
        "choices": [] if with_usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if with_usage:
        event["usage"] = with_usage
    return event


def stream_deltas(chunks: int, tool: str | None) -> list[tuple[dict, str | None]]:
    """Return the deltas of a stream, each with its finish reason."""
    if tool is None:
        deltas = [{"content": f" word{i}"} for i in range(chunks)]
        deltas[0]["role"] = "assistant"
        return [(delta, "stop" if i == chunks - 1 else None) for i, delta in enumerate(deltas)]
    first = {
        "role": "assistant",
        "tool_calls": [
            {"index": 0, "id": "call_0", "type": "function", "function": {"name": tool}}
        ],
    }
    pieces = [
        {"tool_calls": [{"index": 0, "function": {"arguments": f"{i},"}}]} for i in range(chunks)
    ]
    deltas = [first, *pieces]
    last = len(deltas) - 1
    return [(delta, "tool_calls" if i == last else None) for i, delta in enumerate(deltas)]


async def read_request(reader: asyncio.StreamReader) -> dict | None:
    """Read one request's body as JSON; None when the connection ends."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    match = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    length = int(match.group(1)) if match else 0
    try:
        return json.loads(await reader.readexactly(length) or b"{}")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


async def send_stream(writer: asyncio.StreamWriter, how: dict[str, int], tool: str | None) -> None:
    """Send a stream, one event per write, ``pause`` apart."""
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for index, (delta, finish) in enumerate(stream_deltas(how["chunks"], tool)):
        if index:
            await asyncio.sleep(how["pause"] / 1000)
        writer.write(http_chunk(chunk_event(delta, finish)))
        await writer.drain()
    ending = http_chunk(chunk_event({}, with_usage=usage(how["chunks"]))) + http_chunk("[DONE]")
    writer.write(ending + b"0\r\n\r\n")
    await writer.drain()


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer the connection's requests in turn until it closes."""
    try:
        while (body := await read_request(reader)) is not None:
            how, tool = directives(body), tool_name(body)
            if body.get("stream"):
                await send_stream(writer, how, tool)
            else:
                await asyncio.sleep(how["delay"] / 1000)
                writer.write(whole_answer(how["chunks"], tool))
                await writer.drain()
    except ConnectionError:
        pass  # the gateway went away mid-answer: its caller hung up, or its worker died
    finally:
        writer.close()


async def serve(port: int) -> None:
    """Serve on 127.0.0.1:``port`` until killed."""
    server = await asyncio.start_server(serve_connection, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    """Parse the port and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
