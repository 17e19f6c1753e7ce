"""The statements that read money back: an account's, a key's and a member's.

Each read has a locked twin, which takes the rows account first, for a settlement that
charges beyond its hold: the room it reads is the room it charges.
"""

from __future__ import annotations

from sqlalchemy import select

from app.credits.sql.guards import (
    ACCOUNT_ROW,
    KEY_ROW,
    KEYS_MEMBER,
    accounts,
    keys,
    memberships,
    spent_in_window,
)

# What an account and a key have, to say why a hold was refused or how much more than
# its hold a settlement may charge; the locked ones take the rows, account first.
ACCOUNT_MONEY = select(accounts.c.balance, accounts.c.reserved).where(ACCOUNT_ROW)
KEY_MONEY = select(
    keys.c.budget,
    spent_in_window(keys).label("spent"),
    keys.c.window_reserved,
    keys.c.budget_window,
    keys.c.state,
    keys.c.digest,
).where(KEY_ROW)
MEMBER_MONEY = select(
    memberships.c.budget,
    spent_in_window(memberships).label("spent"),
    memberships.c.window_reserved,
    memberships.c.budget_window,
).where(KEYS_MEMBER)
LOCKED_ACCOUNT_MONEY = ACCOUNT_MONEY.with_for_update()
LOCKED_KEY_MONEY = KEY_MONEY.with_for_update()
LOCKED_MEMBER_MONEY = MEMBER_MONEY.with_for_update()
