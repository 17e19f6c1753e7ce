import json

import pytest

from app.completions.sse import DONE, start_stream, write_events
from app.errors import APIError
from app.providers.errors import UpstreamError


def events(stream):
    return [part for part in stream]


def test_chunks_are_framed_as_data_events_ending_with_done():
    out = events(write_events(iter([{"a": 1}, {"b": "é"}])))
    assert out == [b'data: {"a":1}\n\n', 'data: {"b":"é"}\n\n'.encode(), DONE]


def test_an_error_after_the_start_becomes_an_envelope_event_then_done():
    def chunks():
        yield {"a": 1}
        raise UpstreamError("upstream died")

    out = events(write_events(chunks()))
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

    out = events(write_events(chunks()))
    assert b"secret internals" not in out[1]
    assert json.loads(out[1][6:])["error"]["code"] == "server_error"


def test_closing_the_writer_closes_the_chunks():
    closed = []

    def chunks():
        try:
            yield {"a": 1}
            yield {"a": 2}
        finally:
            closed.append(True)

    writer = write_events(chunks())
    next(writer)
    writer.close()
    assert closed == [True]


def test_errors_before_the_first_chunk_raise_to_the_caller():
    def chunks():
        raise APIError("no upstream")
        yield  # pragma: no cover

    with pytest.raises(APIError):
        start_stream(chunks())


def test_start_stream_keeps_the_first_chunk():
    assert list(start_stream(iter([1, 2, 3]))) == [1, 2, 3]
