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


class OrganisationNameRefused(ValueError):
    """An organisation's name is blank or taken (in any letter case); the message says which.

    ``taken_id`` is the id of the organisation that has the name, if that is why.
    """

    def __init__(self, message: str, taken_id: int | None = None) -> None:
        super().__init__(message)
        self.taken_id = taken_id
