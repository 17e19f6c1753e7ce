"""Reading upstreams' vectors, and the built-in model's: float32, in the inputs' order."""

import base64
import struct
from array import array

import pytest

from app.catalog.errors import CatalogError
from app.catalog.registry import build_catalog
from app.providers.base import EmbeddingRequest, RouteTarget, UpstreamConfig
from app.providers.builtin import BuiltinAdapter
from app.providers.errors import UpstreamError, UpstreamRejected
from app.providers.openai_compat import vectors_from
from app.providers.vectors import UnreadableVector


def packed(values):
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def test_vectors_are_read_as_float32_from_numbers_or_base64_and_put_in_index_order():
    data = [
        {"index": 1, "embedding": packed([0.5, -0.25])},
        {"index": 0, "embedding": [0.1, 2]},
    ]

    first, second = vectors_from(data, 2)

    assert first.as_floats() == array("f", [0.1, 2.0]).tolist()
    assert second.as_floats() == [0.5, -0.25]
    # Base64 goes on as it came; numbers are written as base64 of the same float32.
    assert second.as_base64() == packed([0.5, -0.25])
    assert first.as_base64() == packed([0.1, 2.0])


@pytest.mark.parametrize(
    "data",
    [
        None,
        [{"index": 0, "embedding": [0.1]}],
        [{"index": 0, "embedding": [0.1]}, {"index": 0, "embedding": [0.2]}],
        [{"index": 0, "embedding": [0.1]}, {"index": 2, "embedding": [0.2]}],
        [{"index": 0, "embedding": ["a"]}, {"index": 1, "embedding": [0.2]}],
        [{"index": 0, "embedding": []}, {"index": 1, "embedding": [0.2]}],
        [{"index": 0, "embedding": "not base64!"}, {"index": 1, "embedding": [0.2]}],
        [{"index": 0, "embedding": "AAA="}, {"index": 1, "embedding": [0.2]}],
        [{"index": 0, "embedding": "AA=AAAAA"}, {"index": 1, "embedding": [0.2]}],
        [{"index": 0, "embedding": "AAAAAAA="}, {"index": 1, "embedding": [0.2]}],
        [{"index": 0, "embedding": "AAAAAé=="}, {"index": 1, "embedding": [0.2]}],
        [{"index": "0", "embedding": [0.1]}, {"index": 1, "embedding": [0.2]}],
        [[0.1], [0.2]],
    ],
)
def test_anything_but_one_readable_vector_per_input_is_the_upstream_failing(data):
    with pytest.raises(UpstreamError):
        vectors_from(data, 2)


def test_base64_of_the_right_shape_goes_on_as_it_came_and_is_refused_only_when_decoded():
    (vector,) = vectors_from([{"index": 0, "embedding": "AAAA!AAAAAA="}], 1)

    assert vector.as_base64() == "AAAA!AAAAAA="
    with pytest.raises(UnreadableVector):
        vector.as_floats()


def embed(*inputs, dimensions=None, **options):
    adapter = BuiltinAdapter(UpstreamConfig(name="builtin", kind="builtin", options=options))
    request = EmbeddingRequest(model="dev-embed", inputs=list(inputs), dimensions=dimensions)
    return adapter.embed(request, RouteTarget(upstream_model="dev-embed"))


def test_the_builtin_vectors_are_unit_length_deterministic_and_counted_as_its_tokens():
    first = embed("Hello, world!", "hello world")
    again = embed("Hello, world!")

    assert first.vectors[0].as_floats() == again.vectors[0].as_floats()
    assert first.usage.prompt_tokens == 4 + 2
    for vector in first.vectors:
        values = vector.as_floats()
        assert len(values) == 256
        assert abs(sum(value * value for value in values) - 1) < 1e-5


def test_the_builtin_takes_token_ids_and_fewer_dimensions_but_not_more():
    by_ids = embed([10, 20, 30], dimensions=16)

    assert len(by_ids.vectors[0].as_floats()) == 16 and by_ids.usage.prompt_tokens == 3
    with pytest.raises(UpstreamRejected):
        embed("hi", dimensions=257)
    with pytest.raises(UpstreamError):
        embed("hi", fail_after_tokens=0)


def test_an_unknown_embeddings_format_of_an_upstream_stops_the_catalog():
    document = {
        "upstreams": {"u": {"kind": "openai", "base_url": "http://u", "embeddings_format": "int8"}}
    }

    with pytest.raises(CatalogError, match="embeddings_format must be one of base64, float"):
        build_catalog(document, "cat.toml")
