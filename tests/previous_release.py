"""Rows as the release before organisations (revision 0018) wrote them, for migration tests.

The models describe the newest schema; these tables name only the columns an older
database has, so a test can fill one before upgrading it.
"""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import Integer, column, insert, table

from app.auth.keys import DISPLAY_LENGTH, digest_key, generate_key
from app.auth.models import ApiKey
from app.credits.models import Account, LedgerEntry
from app.database import Money, utcnow
from app.extensions import db
from app.generations.models import Generation

ACCOUNTS_AT_0018 = table(
    "accounts",
    *(column(name, Account.__table__.c[name].type)
      for name in ("email", "balance", "reserved", "created_at")),
    column("id"),
    column("is_admin"),
)  # fmt: skip
LEDGER_ENTRIES_AT_0018 = table(
    "ledger_entries",
    *(column(name, LedgerEntry.__table__.c[name].type)
      for name in ("account_id", "kind", "amount", "generation_id", "created_at")),
)  # fmt: skip
API_KEYS_AT_0018 = table(
    "api_keys",
    *(column(name, ApiKey.__table__.c[name].type)
      for name in ("id", "account_id", "name", "digest", "display_prefix", "state", "created_at",
                   "permitted_models")),
    # Renamed by revision 0020 (budgets).
    column("monthly_limit", Money()),
    column("spend_month", Integer()),
    column("month_spent", Money()),
    column("month_reserved", Money()),
)  # fmt: skip
# Generations as 0018 has them: every column of the model but those added since.
GENERATION_COLUMNS_SINCE_0018 = frozenset(
    {"cache_write_1h_tokens", "price_cache_write_1h", "service_tier", "tier_multiplier"}
    | {"tool_calls"}
)
GENERATIONS_AT_0018 = table(
    "generations",
    *(column(name, type_.type) for name, type_ in Generation.__table__.c.items()
      if name not in GENERATION_COLUMNS_SINCE_0018),
)  # fmt: skip


def insert_generation(**values: object) -> None:
    """Insert a finished generation as revision 0018 has them: the model's defaults, ``values``."""
    defaults = {
        column.name: column.default.arg
        for column in Generation.__table__.c
        if column.name in GENERATIONS_AT_0018.c and column.default is not None
        and not callable(column.default.arg)
    }  # fmt: skip
    db.session.execute(insert(GENERATIONS_AT_0018).values({**defaults, **values}))


def insert_account(email: str, *, is_admin: bool = False) -> int:
    """Insert an empty account as revision 0018 has them; return its id."""
    values = {"email": email, "balance": Decimal(0), "reserved": Decimal(0), "is_admin": is_admin}
    inserted = db.session.execute(
        insert(ACCOUNTS_AT_0018).values(created_at=utcnow(), **values).returning(column("id"))
    )
    return inserted.scalar_one()


def insert_key(
    account_id: int, name: str, *, monthly_limit: Decimal | None = None, spend_month: int = 0
) -> tuple[int, str]:
    """Insert an active key as revision 0018 has them; return its id and value."""
    value = generate_key()
    inserted = db.session.execute(
        insert(API_KEYS_AT_0018)
        .values(
            account_id=account_id,
            name=name,
            digest=digest_key(value),
            display_prefix=value[:DISPLAY_LENGTH],
            state="active",
            created_at=utcnow(),
            permitted_models=None,
            monthly_limit=monthly_limit,
            spend_month=spend_month,
            month_spent=Decimal(0),
            month_reserved=Decimal(0),
        )
        .returning(column("id"))
    )
    return inserted.scalar_one(), value
