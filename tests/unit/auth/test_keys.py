import pytest

from app.auth.decorators import bearer_token
from app.auth.keys import KEY_LENGTH, KEY_PREFIX, digest_key, generate_key, parse_key


def test_generated_keys_are_well_formed_and_distinct():
    keys = {generate_key() for _ in range(200)}
    assert len(keys) == 200
    for key in keys:
        assert key.startswith(KEY_PREFIX)
        assert len(key) == KEY_LENGTH
        assert parse_key(key) == key


def _mistype(key: str) -> str:
    position = len(KEY_PREFIX) + 5
    replacement = "A" if key[position] != "A" else "B"
    return key[:position] + replacement + key[position + 1 :]


VALID = generate_key()


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "sk-gw-",
        VALID[:-1],
        VALID + "x",
        "sk-xx-" + VALID[len(KEY_PREFIX) :],
        VALID.replace(KEY_PREFIX, "SK-GW-"),
        _mistype(VALID),
        VALID[:-6] + "000000",
        VALID[:20] + "-" + VALID[21:],
        VALID[:20] + "é" + VALID[21:],
        "sk-proj-abcdefghijklmnopqrstuvwxyz",
    ],
)
def test_malformed_keys_are_refused_before_any_lookup(raw):
    assert parse_key(raw) is None


def test_digest_is_sha256_hex():
    assert digest_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("Bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header, token):
    assert bearer_token(header) == token
