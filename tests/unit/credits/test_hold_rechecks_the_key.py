"""A hold re-checks the key its caller presented: active, and under the same value.

A process may remember a caller past a change to its key (app.auth.caller_cache);
nothing is held, so nothing can be charged, on a key revoked, rotated or deleted since.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from app.accounts.keys import delete_key, revoke_key, rotate_key
from app.auth.errors import InvalidKey, KeyRevoked
from app.auth.keys import digest_key
from app.credits import balances, holds
from app.credits.models import Account, Hold
from app.extensions import db
from tests.factories import AccountFactory


def hold_for(account, issued, *, digest: str | None):
    return holds.place_hold(
        account_id=account.id,
        amount=Decimal("0.5"),
        ttl_seconds=60,
        key_id=issued.id,
        key_digest=digest,
    )


def nothing_held(account) -> bool:
    db.session.expire_all()
    reserved = db.session.get(Account, account.id).reserved
    return reserved == 0 and db.session.query(Hold).filter_by(account_id=account.id).count() == 0


def test_the_key_as_presented_is_held_on(app_context):
    account, issued = AccountFactory.with_key(credits=Decimal("10"))

    held = hold_for(account, issued, digest=digest_key(issued.value))

    assert isinstance(held, balances.HeldCredit) and held.key_id == issued.id


@pytest.mark.parametrize(
    ("change", "refusal"),
    [(revoke_key, KeyRevoked), (rotate_key, InvalidKey), (delete_key, InvalidKey)],
)
def test_a_key_changed_since_its_caller_was_found_holds_nothing(app_context, change, refusal):
    account, issued = AccountFactory.with_key(credits=Decimal("10"))
    presented = digest_key(issued.value)

    change(issued.id)

    with pytest.raises(refusal):
        hold_for(account, issued, digest=presented)
    assert nothing_held(account)
