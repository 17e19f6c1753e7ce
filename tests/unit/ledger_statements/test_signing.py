"""The statements' signing key: the operator's, else one kept in the instance folder.

Never one made on the spot in production.
"""

from __future__ import annotations

import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from app.ledger_statements.errors import SigningKeyMissing
from app.ledger_statements.signing import KEY_FILE, key_id, signing_key
from config.settings import ConfigurationError, settings_from_environment
from tests.statement_checks import new_signing_pem


def test_development_makes_a_key_once_and_keeps_it_private(tmp_path):
    first = signing_key(configured=None, env_name="development", instance_path=str(tmp_path))
    kept = tmp_path / KEY_FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    again = signing_key(configured=None, env_name="development", instance_path=str(tmp_path))
    assert key_id(again) == key_id(first)
    assert [path.name for path in tmp_path.iterdir()] == [KEY_FILE]


def test_production_without_a_key_refuses_rather_than_make_one(tmp_path):
    with pytest.raises(SigningKeyMissing) as refused:
        signing_key(configured=None, env_name="production", instance_path=str(tmp_path))
    assert refused.value.status == 503 and "LEDGER_SIGNING_KEY" in refused.value.message
    assert not (tmp_path / KEY_FILE).exists()


def test_the_configured_key_signs_in_every_environment(tmp_path):
    pem = new_signing_pem()
    for env_name in ("production", "development"):
        key = signing_key(configured=pem, env_name=env_name, instance_path=str(tmp_path))
        assert key_id(key) == key_id(signing_key(configured=pem, env_name="", instance_path=""))
    assert not (tmp_path / KEY_FILE).exists()


def rsa_pem() -> str:
    """An RSA key: a key, but not the kind that signs statements."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


@pytest.mark.parametrize(
    "make_value",
    [
        lambda: "not a key",
        lambda: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        rsa_pem,
    ],
)
def test_a_key_that_is_no_ed25519_pem_stops_the_start_without_showing_it(make_value):
    value = make_value()
    with pytest.raises(ConfigurationError, match="LEDGER_SIGNING_KEY: must be") as refused:
        settings_from_environment({"LEDGER_SIGNING_KEY": value})
    assert value not in str(refused.value)


def test_an_ed25519_pem_is_taken_as_is():
    pem = new_signing_pem()
    assert settings_from_environment({"LEDGER_SIGNING_KEY": pem}) == {"LEDGER_SIGNING_KEY": pem}
