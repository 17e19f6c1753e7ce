"""What a change to an organisation, its members or their keys can run into."""

from __future__ import annotations


class KeyNotFound(LookupError):
    """No key has the given id (operator commands)."""


class InvalidKeyLimits(ValueError):
    """A key's permitted models or monthly limit cannot be set; the message says why."""


class MemberNotFound(LookupError):
    """No member of this organisation has the given id or email (or no such organisation)."""


class NotAllowed(PermissionError):
    """The member's role does not allow the change; the message says which role would."""


class LastOwner(ValueError):
    """The change would leave the organisation without an owner."""


class AlreadyMember(ValueError):
    """The person is a member of the organisation already."""
