"""Read a Server-Sent Events stream as it arrives, whatever the reads cut it into.

Follows the WHATWG event-stream rules that upstreams rely on: lines end in CRLF, LF or a
lone CR; ``:`` starts a comment (OpenRouter's ``: OPENROUTER PROCESSING``, keep-alives);
``event:`` names the event (Anthropic's protocol); several ``data:`` lines join with a
newline; a blank line dispatches the event; one space after the colon is dropped. Lines
are split as bytes and decoded whole, so a UTF-8 character cut by a read stays intact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from app.encoding import loads
from app.providers.errors import UpstreamError

LINE_BREAK = re.compile(rb"\r\n|\r|\n")
# The line that ends a block cut at a blank line, which the cut took away.
BLANK_LINE = (b"",)
# Read after the last read: it ends the line a CR may have left unfinished.
END_OF_STREAM = (b"\n",)


@dataclass(slots=True)
class ServerSentEvent:
    """One dispatched event: its name (``message`` unless named) and its data.

    ``more`` says that another event completed by the same read follows it: nothing
    need wait for the network between the two. Not frozen: one is made per relayed
    event, and a frozen dataclass's construction costs twice as much.
    """

    event: str
    data: str
    more: bool = field(default=False, compare=False)


def split_lines(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Split the complete lines off ``buffer``; return them and the unfinished rest."""
    # Nearly every upstream ends its lines in LF alone: split on it without the pattern.
    lines = LINE_BREAK.split(buffer) if b"\r" in buffer else buffer.split(b"\n")
    rest = lines.pop()
    if lines and buffer.endswith(b"\r"):
        # The CR may be the first half of a CRLF whose LF is in the next read: keep the
        # line back, or the LF would read as one more (event-dispatching) blank line.
        rest = lines.pop() + b"\r"
    return lines, rest


def read_events(reads: Iterable[bytes]) -> Iterator[ServerSentEvent]:
    """Return the events of a stream delivered as ``reads`` of any size, as they come.

    Every event but the last that a read completes says ``more``.
    """
    # Chained in C, not yielded by a generator, whose frame every event would resume;
    # nor looped over, whose variables would keep the last read and its lines for as
    # long as the stream waits for the next. The line end read last ends a line whose
    # CR was held back; an event without its blank line is unfinished and dropped, as
    # the rules say.
    return chain.from_iterable(map(EventBuilder().take_read, chain(reads, END_OF_STREAM)))


class EventBuilder:
    """Collects field lines into events and dispatches each at its blank line."""

    def __init__(self) -> None:
        self.event = ""
        self.data: list[str] = []
        # The start of a line whose end is in a later read.
        self.rest = b""

    def take_read(self, read: bytes) -> list[ServerSentEvent]:
        """Apply the lines ``read`` completes; return every event they complete."""
        buffer = self.rest + read
        # find rather than ``in``, here and for every event below: bytes' ``in`` first
        # tries its operand as an integer, raising and dropping a TypeError each time.
        if buffer.find(b"\r") >= 0:
            lines, self.rest = split_lines(buffer)
            return self.take(lines)
        # Nearly every upstream ends its lines in LF alone, so that a blank line follows
        # "\n": cut at "\n\n", the read is the blocks of lines each blank line ends,
        # the same lines as cut at "\n", and most blocks are one event's one data line.
        blocks = buffer.split(b"\n\n")
        lines = blocks.pop().split(b"\n")
        self.rest = lines.pop()
        events: list[ServerSentEvent] = []
        for block in blocks:
            if block[:6] == b"data: " and not self.data and block.find(b"\n") < 0:
                data = block[6:].decode("utf-8", "replace")
                events.append(ServerSentEvent(self.event or "message", data, True))
                self.event = ""
            else:
                self._take_lines(block.split(b"\n"), events)
                self._take_lines(BLANK_LINE, events)
        return self._ended(self._take_lines(lines, events))

    def take(self, lines: list[bytes]) -> list[ServerSentEvent]:
        """Apply ``lines``; return every event they complete, all but the last with ``more``."""
        return self._ended(self._take_lines(lines, []))

    def _take_lines(
        self, lines: Iterable[bytes], events: list[ServerSentEvent]
    ) -> list[ServerSentEvent]:
        # Appends each event the lines complete to ``events``, as if more followed it.
        for line in lines:
            if line[:6] == b"data: ":
                # Nearly every line: read here, without _take_field's general parse.
                self.data.append(line[6:].decode("utf-8", "replace"))
            elif line:
                self._take_field(line)
            elif self.data:
                events.append(ServerSentEvent(self.event or "message", "\n".join(self.data), True))
                self.event, self.data = "", []
            else:
                self.event = ""
        return events

    @staticmethod
    def _ended(events: list[ServerSentEvent]) -> list[ServerSentEvent]:
        # The last event a read completes is the one no other follows without a wait.
        if events:
            events[-1].more = False
        return events

    def _take_field(self, line: bytes) -> None:
        if line[:1] == b":":
            return
        name, _, value = line.decode("utf-8", "replace").partition(":")
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            self.data.append(value)
        elif name == "event":
            self.event = value
        # id and retry steer a browser's reconnection; an upstream call never reconnects.


def json_object(data: str) -> dict[str, Any]:
    """Decode one event's data as the JSON object it must be; raise UpstreamError if not."""
    try:
        payload = loads(data)
    except ValueError:
        payload = None
    if type(payload) is not dict:
        raise UpstreamError("The model's upstream sent a malformed event.")
    return payload
