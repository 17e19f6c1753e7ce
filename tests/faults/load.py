"""The fault run's callers: threads sending chat completions and noting what came back.

Each thread draws its requests from a ``random.Random`` of its own, seeded from the
run's seed: streamed answers (some with tools, some hung up by their caller part way),
whole answers, and whole answers with an ``Idempotency-Key`` that are retried as the
openai SDK retries (on connection errors, timeouts, 408, 409, 429 and 5xx, same key and
body, backing off from 0.5 s). Some of those ask for an answer slower than their caller
waits, so that their retries come while the first request still runs, past the hold's
TTL. Every attempt sends an ``X-Request-Id`` of its own, which the generation record
keeps, and is written down as an ``Attempt`` for the checks.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import requests

MODEL = "fault-chat"
TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
]
CONNECT_TIMEOUT = 3
# Between two reads of an answer: longer than the run stops the upstream for.
READ_TIMEOUT = 10
# A caller that waits less than its slow answer takes, and retries.
IMPATIENT_TIMEOUT = 2.5
SLOW_ANSWER_MS = 7000
SDK_MAX_RETRIES = 5
SDK_FIRST_PAUSE, SDK_LONGEST_PAUSE = 0.5, 8.0
RETRIED_STATUSES = (408, 409, 429)
# The exceptions of a connection that broke, or of an answer that stopped coming.
BROKEN = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


@dataclass
class Attempt:
    """One HTTP request of a caller and what it saw; times are ``time.monotonic()``."""

    request_id: str
    account_id: int
    streamed: bool
    key: str | None
    started: float
    status: int | None = None
    # The parsed body of an answer other than 200 (or its text, if it was no JSON).
    error_body: Any = None
    # done, broken, hung_up, answered, refused (no answer), error (not 200)
    outcome: str = "refused"
    first_text_at: float | None = None
    ended_at: float | None = None
    texts: int = 0
    # usage.cost.total_cost of a whole answer, or of a stream's usage chunk.
    cost: Decimal | None = None
    generation_id: str | None = None
    replayed: bool = False
    sse_errors: list[Any] = field(default_factory=list)
    client_port: int | None = None

    @property
    def delivered_seconds(self) -> float:
        """How long the caller received text before the answer ended or broke."""
        if self.first_text_at is None or self.ended_at is None:
            return 0.0
        return self.ended_at - self.first_text_at


@dataclass(frozen=True)
class Caller:
    """Who a thread calls as: the account's id and its API key."""

    account_id: int
    key: str


class Load:
    """The callers' shared state: the gateway, the attempts, and the gate faults close."""

    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.seed = seed
        self.attempts: list[Attempt] = []
        self.streaming: dict[str, Attempt] = {}
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self.stop = threading.Event()
        # Cleared while a fault wants no request to start (see faults.quiet_termination).
        self.admit = threading.Event()
        self.admit.set()

    def new_attempt(self, caller: Caller, streamed: bool, key: str | None) -> Attempt:
        """Write down a new attempt, with a request id of its own."""
        number = next(self._numbers)
        attempt = Attempt(
            f"fault-{self.seed}-{number}", caller.account_id, streamed, key, time.monotonic()
        )
        with self._lock:
            self.attempts.append(attempt)
        return attempt

    def long_streams(self, delivered_for: float) -> list[Attempt]:
        """Return the streams in flight that have delivered text for ``delivered_for`` s."""
        now = time.monotonic()
        with self._lock:
            return [
                a
                for a in self.streaming.values()
                if a.first_text_at is not None and now - a.first_text_at >= delivered_for
            ]

    def streams_in_flight(self) -> int:
        """Return how many streams are being read now."""
        with self._lock:
            return len(self.streaming)

    def reading(self, attempt: Attempt, streaming: bool) -> None:
        """Note that ``attempt``'s stream is being read, or is no longer."""
        with self._lock:
            if streaming:
                self.streaming[attempt.request_id] = attempt
            else:
                self.streaming.pop(attempt.request_id, None)

    def run_caller(self, caller: Caller, thread: int, first_slow: bool) -> None:
        """Send requests until the load stops; in a thread of its own."""
        rng = random.Random(f"{self.seed}-{thread}")
        for number in itertools.count():
            if self.stop.is_set():
                return
            # Bounded: a fault opens the gate again within seconds.
            if not self.admit.wait(timeout=10):
                continue
            slow = first_slow and number == 0
            self._one_request(caller, rng, f"key-{self.seed}-{thread}-{number}", slow)

    def _one_request(self, caller: Caller, rng: random.Random, key: str, slow: bool) -> None:
        draw = rng.random()
        tools = rng.random() < 0.2
        if slow or draw < 0.25:
            slow = slow or rng.random() < 0.15
            refused = self.keyed_whole(caller, rng, key, tools=tools, slow=slow).status != 200
        elif draw < 0.45:
            refused = self.whole(caller, whole_body(rng, tools=tools), READ_TIMEOUT).status != 200
        else:
            hang_up_after = rng.randint(8, 40) if rng.random() < 0.2 else None
            attempt = self.stream(caller, stream_body(rng, tools=tools), hang_up_after)
            refused = attempt.status != 200
        # A caller refused (out of credits, or the gateway is restarting) waits a little.
        self.stop.wait(rng.uniform(0.0, 0.2) + (0.5 if refused else 0))

    def keyed_whole(
        self, caller: Caller, rng: random.Random, key: str, *, tools: bool, slow: bool
    ) -> Attempt:
        """Ask for a whole answer under ``key``, retried as the openai SDK retries; the last."""
        body = whole_body(rng, tools=tools, delay_ms=SLOW_ANSWER_MS if slow else None)
        timeout = IMPATIENT_TIMEOUT if slow else READ_TIMEOUT
        for retry in range(SDK_MAX_RETRIES + 1):
            attempt = self.whole(caller, body, timeout, key=key)
            if not retried_by_sdk(attempt) or retry == SDK_MAX_RETRIES:
                break
            pause = min(SDK_FIRST_PAUSE * 2**retry, SDK_LONGEST_PAUSE)
            if self.stop.wait(pause * (1 - 0.25 * rng.random())):
                break
        return attempt

    def whole(self, caller: Caller, body: dict, timeout: float, key: str | None = None) -> Attempt:
        """Send one request for a whole answer; return its attempt."""
        attempt = self.new_attempt(caller, False, key)
        headers = self.headers(caller, attempt, key)
        try:
            response = requests.post(
                f"{self.url}/v1/chat/completions",
                json=body,
                headers=headers,
                timeout=(CONNECT_TIMEOUT, timeout),
            )
        except BROKEN:
            attempt.ended_at = time.monotonic()
            return attempt
        attempt.ended_at = time.monotonic()
        note_whole_answer(attempt, response)
        return attempt

    def stream(self, caller: Caller, body: dict, hang_up_after: int | None) -> Attempt:
        """Send one request for a stream and read it, hanging up after some text if told."""
        attempt = self.new_attempt(caller, True, None)
        try:
            response = requests.post(
                f"{self.url}/v1/chat/completions",
                json=body,
                headers=self.headers(caller, attempt, None),
                timeout=(CONNECT_TIMEOUT, READ_TIMEOUT),
                stream=True,
            )
        except BROKEN:
            attempt.ended_at = time.monotonic()
            return attempt
        with response:
            if response.status_code != 200:
                attempt.ended_at = time.monotonic()
                note_whole_answer(attempt, response)
                return attempt
            attempt.status = 200
            attempt.client_port = client_port(response)
            self.reading(attempt, True)
            try:
                read_stream(attempt, response, hang_up_after)
            finally:
                self.reading(attempt, False)
        return attempt

    @staticmethod
    def headers(caller: Caller, attempt: Attempt, key: str | None) -> dict[str, str]:
        """Return the request's headers: its key, its request id, its Idempotency-Key."""
        headers = {"Authorization": f"Bearer {caller.key}", "X-Request-Id": attempt.request_id}
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers


def retried_by_sdk(attempt: Attempt) -> bool:
    """Tell whether the openai SDK would send ``attempt``'s request again."""
    if attempt.status is None:
        return True
    return attempt.status in RETRIED_STATUSES or attempt.status >= 500


def whole_body(rng: random.Random, *, tools: bool, delay_ms: int | None = None) -> dict:
    """Return the body of a request for a whole answer."""
    delay = delay_ms if delay_ms is not None else rng.randint(50, 400)
    text = f"chunks={rng.randint(20, 60)} delay={delay} note {rng.getrandbits(32)}"
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    if tools:
        body["tools"] = TOOLS
    return body


def stream_body(rng: random.Random, *, tools: bool) -> dict:
    """Return the body of a request for a stream long enough for faults to land in it."""
    chunks, pause = rng.randint(40, 80), rng.choice((30, 40, 50))
    text = f"chunks={chunks} pause={pause} note {rng.getrandbits(32)}"
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if tools:
        body["tools"] = TOOLS
    return body


def decoded(text: str) -> Any:
    """Decode JSON with exact decimals; None if it is not JSON."""
    try:
        return json.loads(text, parse_float=Decimal)
    except ValueError:
        return None


def note_whole_answer(attempt: Attempt, response: requests.Response) -> None:
    """Write down a whole answer: its cost and generation, or its error."""
    attempt.status = response.status_code
    body = decoded(response.text)
    if response.status_code != 200:
        attempt.outcome = "error"
        attempt.error_body = body if body is not None else response.text
        return
    attempt.outcome = "answered"
    attempt.generation_id = body["id"]
    attempt.cost = Decimal(body["usage"]["cost"]["total_cost"])
    attempt.replayed = response.headers.get("Idempotent-Replayed") == "true"


def client_port(response: requests.Response) -> int | None:
    """Return the local port of the connection an answer is read from."""
    connection = getattr(response.raw, "connection", None)
    sock = getattr(connection, "sock", None)
    return sock.getsockname()[1] if sock is not None else None


def read_stream(attempt: Attempt, response: requests.Response, hang_up_after: int | None) -> None:
    """Read a stream's events into ``attempt`` until [DONE], a break, or the hang-up."""
    attempt.outcome = "broken"
    try:
        for line in response.iter_lines():
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                attempt.outcome = "done"
                break
            note_event(attempt, decoded(line[6:].decode()))
            if hang_up_after is not None and attempt.texts >= hang_up_after:
                attempt.outcome = "hung_up"
                break
    except BROKEN:
        pass
    attempt.ended_at = time.monotonic()


def note_event(attempt: Attempt, event: Any) -> None:
    """Write down one event of a stream: text, its usage, or an error."""
    if not isinstance(event, dict) or "error" in event:
        attempt.sse_errors.append(event)
        return
    attempt.generation_id = event.get("id", attempt.generation_id)
    if usage := event.get("usage"):
        attempt.cost = Decimal(usage["cost"]["total_cost"])
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls"):
            attempt.texts += 1
            if attempt.first_text_at is None:
                attempt.first_text_at = time.monotonic()
