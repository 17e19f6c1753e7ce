"""The benchmark's clients: raw HTTP/1.1 over asyncio, light enough not to be measured.

``send_requests`` keeps ``concurrency`` keep-alive connections busy until ``count``
requests were answered and times each one (latency to the body's end, and time to the
first byte of the body: the first event of a stream). ``open_streams`` opens streams and
holds them without reading past their first event, as many slow readers would.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

DONE = b"data: [DONE]\n\n"


@dataclass
class Timings:
    """What one batch of requests measured, in seconds."""

    latencies: list[float] = field(default_factory=list)
    first_bytes: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    elapsed: float = 0.0


def chat_request(port: int, body: bytes, key: str | None) -> bytes:
    """Return the bytes of one POST /v1/chat/completions."""
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    """Read a response's status and headers (names lower-cased)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = head[:-4].split(b"\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


async def read_body(
    reader: asyncio.StreamReader, headers: dict[bytes, bytes], started: float
) -> tuple[bytes, float]:
    """Read a body (sized or chunked); return it and when its first byte came."""
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
        return body, time.perf_counter() - started
    parts, first = [], 0.0
    while True:
        size = int((await reader.readline()).split(b";")[0], 16)
        if not first:
            first = time.perf_counter() - started
        if size == 0:
            await reader.readline()
            return b"".join(parts), first
        parts.append((await reader.readexactly(size + 2))[:-2])


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes, streamed: bool
) -> tuple[float, float, str | None]:
    started = time.perf_counter()
    writer.write(request)
    status, headers = await read_head(reader)
    body, first = await read_body(reader, headers, started)
    latency = time.perf_counter() - started
    if status != 200:
        return latency, first, f"{status}: {body[:200]!r}"
    if streamed and not body.endswith(DONE) or b'"error"' in body[-400:]:
        return latency, first, f"bad stream end: {body[-200:]!r}"
    return latency, first, None


async def _connection(
    port: int, request: bytes, streamed: bool, tickets: itertools.count, count: int, out: Timings
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while next(tickets) < count:
            latency, first, error = await _exchange(reader, writer, request, streamed)
            out.latencies.append(latency)
            out.first_bytes.append(first)
            if error:
                out.errors.append(error)
    finally:
        writer.close()


async def send_requests(
    port: int, body: bytes, key: str | list[str] | None, *, count: int, concurrency: int,
    streamed: bool,
) -> Timings:  # fmt: skip
    """Send ``count`` requests over ``concurrency`` connections; time each.

    Given a list of keys, connection i sends every request of its own with key i (modulo
    the list's length): many callers at once, as an organisation's members are.
    """
    keys = key if isinstance(key, list) else [key]
    requests = [chat_request(port, body, each) for each in keys]
    out, tickets = Timings(), itertools.count()
    started = time.perf_counter()
    await asyncio.gather(
        *(
            _connection(port, requests[number % len(requests)], streamed, tickets, count, out)
            for number in range(concurrency)
        )
    )
    out.elapsed = time.perf_counter() - started
    return out


async def _open_stream(
    port: int, request: bytes, gate: asyncio.Semaphore, timeout: float
) -> asyncio.StreamWriter | None:
    async with gate:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return None
        try:
            writer.write(request)
            status, headers = await asyncio.wait_for(read_head(reader), timeout)
            # The first event arrives with the headers; not reading further leaves the
            # rest of the stream to the kernel's buffers, as a slow reader would.
            await asyncio.wait_for(reader.readuntil(b"\n\n"), timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            writer.close()
            return None
        if status != 200:
            writer.close()
            return None
        return writer


async def open_streams(
    port: int, body: bytes, key: str | None, *, count: int, opening: int = 200,
    timeout: float = 120.0,
) -> list[asyncio.StreamWriter]:  # fmt: skip
    """Open ``count`` streams, ``opening`` at a time; return those that started."""
    request = chat_request(port, body, key)
    gate = asyncio.Semaphore(opening)
    opened = await asyncio.gather(
        *(_open_stream(port, request, gate, timeout) for _ in range(count))
    )
    return [writer for writer in opened if writer is not None]


async def close_streams(writers: list[asyncio.StreamWriter]) -> None:
    """Hang up on every held stream."""
    for writer in writers:
        writer.close()
    await asyncio.sleep(0)
