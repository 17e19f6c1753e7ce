"""read_events: the event-stream rules upstreams rely on, however the reads cut the stream."""

from __future__ import annotations

import pytest

from app.providers.event_stream import ServerSentEvent, read_events, split_lines

STREAM = (
    b": OPENROUTER PROCESSING\n\n"
    b'event: message_start\r\ndata: {"type":"message_start"}\r\n\r\n'
    b"data: first line\ndata: second line\n\n"
    b": ping - 2025-10-14 09:21:40.118735+00:00\r\r"
    b"id: 7\nretry: 1000\ndata:no space\n\n"
    b"data: caf\xc3\xa9 \xe2\x98\x95\r\n\r\n"
    b"data: [DONE]\r\r"
)
EVENTS = [
    ServerSentEvent("message_start", '{"type":"message_start"}'),
    ServerSentEvent("message", "first line\nsecond line"),
    ServerSentEvent("message", "no space"),
    ServerSentEvent("message", "caf\u00e9 \u2615"),
    ServerSentEvent("message", "[DONE]"),
]


def cut(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64, len(STREAM)])
def test_events_survive_any_cut_of_the_stream(size):
    assert list(read_events(cut(STREAM, size))) == EVENTS


def test_a_crlf_split_between_reads_is_one_line_end():
    reads = [b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]

    assert list(read_events(reads)) == [ServerSentEvent("message", "a\nb")]


def test_comments_and_empty_blocks_dispatch_nothing_and_reset_the_name():
    reads = [b": keep-alive\n\nevent: ping\n\n\ndata: x\n\n"]

    assert list(read_events(reads)) == [ServerSentEvent("message", "x")]


def test_an_event_without_its_blank_line_is_dropped_at_the_end():
    assert list(read_events([b"data: complete\n\ndata: cut"])) == [
        ServerSentEvent("message", "complete")
    ]


def test_split_lines_keeps_a_trailing_cr_back():
    assert split_lines(b"a\nb\r") == ([b"a"], b"b\r")
    assert split_lines(b"a\r\nb") == ([b"a"], b"b")


def test_split_lines_ends_lines_at_every_kind_of_break_alike():
    assert split_lines(b"a\n\nb\nc") == ([b"a", b"", b"b"], b"c")
    assert split_lines(b"a\r\rb\r\nc") == ([b"a", b"", b"b"], b"c")
    assert split_lines(b"a\n\rb\r\nc\n") == ([b"a", b"", b"b", b"c"], b"")


def test_every_event_but_the_last_a_read_completes_says_more():
    reads = [b"data: a\n\ndata: b\n\ndata: c", b"\n\n", b"data: d\n\ndata: e\n\n"]

    flags = [(event.data, event.more) for event in read_events(reads)]

    assert flags == [("a", True), ("b", False), ("c", False), ("d", True), ("e", False)]


LF_STREAM = STREAM.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64, len(LF_STREAM)])
def test_a_stream_of_lf_line_ends_reads_alike_however_cut(size):
    assert list(read_events(cut(LF_STREAM, size))) == EVENTS
