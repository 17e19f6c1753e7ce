import tracemalloc
from decimal import Decimal

from app.encoding import dumps, loads


def test_dumps_is_compact_json_with_exact_money():
    encoded = dumps({"cost": Decimal("0.0000123"), "text": "héllo"})

    assert encoded == b'{"cost":0.0000123,"text":"h\xc3\xa9llo"}'
    assert loads(encoded)["cost"] == float(Decimal("0.0000123"))


def test_encoded_json_holds_no_more_memory_than_its_bytes():
    # Request bodies stay alive as long as their stream: 9,000 open streams must not
    # each keep an encoder's whole buffer.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [dumps({"model": "m", "index": index}) for index in range(200)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()

    assert held < len(kept) * 256
