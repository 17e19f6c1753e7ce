"""What an account holder's change to their keys can run into."""

from __future__ import annotations


class KeyNotFound(LookupError):
    """No key has the given id (operator commands)."""


class InvalidKeyLimits(ValueError):
    """A key's permitted models or monthly limit cannot be set; the message says why."""
