import json

import pytest

from app.errors import APIError
from app.providers.errors import UpstreamError
from app.sse import Framing, data_event, first_chunk, typed_event, write_events

DONE = b"data: [DONE]\n\n"
# Chat Completions' framing, as a door would give it.
FRAMING = Framing(frame=data_event, error=lambda error: data_event(error.to_envelope()), end=DONE)


def events(stream):
    """The framed events the writer sent, however it grouped them into sends."""
    return [event + b"\n\n" for event in b"".join(stream).split(b"\n\n")[:-1]]


def test_chunks_are_framed_as_data_events_ending_with_done():
    out = events(write_events(iter([{"a": 1}, None, {"b": "é"}, None]), FRAMING))
    assert out == [b'data: {"a":1}\n\n', 'data: {"b":"é"}\n\n'.encode(), DONE]


def test_events_go_out_together_until_a_none_says_the_next_may_wait():
    chunks = [{"a": 0}, None, {"a": 1}, {"a": 2}, None, {"a": 3}, None, None]
    sends = list(write_events(iter(chunks), FRAMING))

    assert sends == [
        b'data: {"a":0}\n\n',
        b'data: {"a":1}\n\ndata: {"a":2}\n\n',
        b'data: {"a":3}\n\n',
        DONE,
    ]


def test_the_first_event_goes_out_alone_before_the_rest_of_its_read():
    pulled = []

    def chunks():
        yield {"a": 1}
        pulled.append("the second event")
        yield {"a": 2}
        yield None

    writer = write_events(chunks(), FRAMING)

    assert next(writer) == b'data: {"a":1}\n\n'
    assert pulled == []
    assert next(writer) == b'data: {"a":2}\n\n'


def test_events_are_sent_before_the_writer_waits_for_the_next():
    pulled = []

    def chunks():
        yield {"a": 0}
        yield {"a": 1}
        yield {"a": 2}
        yield None
        pulled.append("the next read")
        yield {"a": 3}

    writer = write_events(chunks(), FRAMING)

    assert next(writer) == b'data: {"a":0}\n\n'
    assert next(writer) == b'data: {"a":1}\n\ndata: {"a":2}\n\n'
    assert pulled == []
    assert next(writer) == b'data: {"a":3}\n\n' + DONE


def test_an_error_after_the_start_becomes_an_envelope_event_then_done():
    def chunks():
        yield {"a": 1}
        raise UpstreamError("upstream died")

    out = events(write_events(chunks(), FRAMING))
    assert out[0] == b'data: {"a":1}\n\n'
    error = json.loads(out[1][len(b"data: ") :])
    assert error == {
        "error": {
            "message": "upstream died",
            "type": "api_error",
            "code": "upstream_error",
            "param": None,
        }
    }
    assert out[2] == DONE


def test_an_unexpected_error_reveals_nothing():
    def chunks():
        yield {"a": 1}
        raise RuntimeError("secret internals")

    out = events(write_events(chunks(), FRAMING))
    assert b"secret internals" not in out[1]
    assert json.loads(out[1][6:])["error"]["code"] == "server_error"


def test_closing_the_writer_closes_the_chunks():
    closed = []

    def chunks():
        try:
            yield {"a": 1}
            yield None
            yield {"a": 2}
        finally:
            closed.append(True)

    writer = write_events(chunks(), FRAMING)
    next(writer)
    writer.close()
    assert closed == [True]


def test_errors_before_the_first_chunk_raise_to_the_caller():
    def chunks():
        raise APIError("no upstream")
        yield  # pragma: no cover

    with pytest.raises(APIError):
        first_chunk(chunks())


def test_a_none_before_the_first_chunk_does_not_start_the_stream():
    def chunks():
        yield None
        raise APIError("no upstream")

    with pytest.raises(APIError):
        first_chunk(chunks())


def test_the_first_chunk_is_the_first_that_is_not_none():
    chunks = iter([None, {"a": 1}, None, {"a": 2}])

    assert first_chunk(chunks) == {"a": 1}
    assert list(chunks) == [None, {"a": 2}]


def test_chunks_that_end_before_any_have_no_first_and_send_only_done():
    assert first_chunk(iter([None, None])) is None
    assert list(write_events(iter([]), FRAMING, None)) == [DONE]


def test_a_first_chunk_pulled_before_goes_out_at_once_then_the_others_as_they_come():
    pulled = []

    def chunks():
        pulled.append("the next read")
        yield {"a": 2}
        yield {"a": 3}
        yield None

    writer = write_events(chunks(), FRAMING, {"a": 1})

    assert next(writer) == b'data: {"a":1}\n\n'
    assert pulled == []
    assert next(writer) == b'data: {"a":2}\n\ndata: {"a":3}\n\n'
    assert next(writer) == DONE


def test_a_typed_event_is_named_by_its_bodys_type():
    assert typed_event({"type": "message_stop"}) == (
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def test_a_framing_without_an_end_writes_nothing_after_the_last_event():
    framing = Framing(frame=typed_event, error=lambda error: b"")
    assert b"".join(write_events(iter([{"type": "a"}]), framing)) == (
        b'event: a\ndata: {"type":"a"}\n\n'
    )
