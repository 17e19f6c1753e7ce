"""PostgreSQL's work for a hold and for a settlement apart, counted in its backends.

bench/instructions.py --postgresql counts a whole request's work in PostgreSQL's
backends; this splits it between the request's two statements, to see which of them a
change to the ledger's statements moved. On a private server under callgrind
(bench/counted_postgres.py), an account with a key (``--budget``: a key with a budget
of its own, which its holds reserve on; ``--budgets``: a key and its member with budgets
of their own and the account with a balance alert set, none of them reached) places
``--holds`` holds through the ledger
(app.credits.holds.place_hold), then settles each with its generation's record and
rollup (settle_hold), as a chat completion does; the backends' instructions of each
phase are divided by the holds. A warm-up of 30 of each comes first.

    .venv/bin/python bench/ledger_statements.py [--holds 40] [--budget | --budgets]
"""

from __future__ import annotations

import argparse
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.counted_postgres import Marks, counted_postgres  # noqa: E402
from bench.run import free_port  # noqa: E402

WARM_UP = 30
# A chat completion's hold and charge, in USD.
HOLD, COST = Decimal("0.01"), Decimal("0.002")


def main(argv: list[str] | None = None) -> None:
    """Count the backends' instructions per hold and per settlement; print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", type=int, default=40, help="holds counted, then settled")
    shapes = parser.add_mutually_exclusive_group()
    shapes.add_argument("--budget", action="store_true", help="the key has a budget")
    shapes.add_argument(
        "--budgets",
        action="store_true",
        help="the key and its member have budgets, the account a balance alert",
    )
    args = parser.parse_args(argv)
    with counted_postgres(free_port()) as (url, counts):
        app = migrated_app(url)
        with app.app_context():
            ledger = Ledger(args.budget or args.budgets, args.budgets)
            ledger.settle(ledger.hold(WARM_UP))
            marks = Marks(url, Path(counts))
            held: list[Any] = []
            holding = marks.counted(lambda: held.extend(ledger.hold(args.holds)))
            settling = marks.counted(lambda: ledger.settle(held))
            ledger.close()
    kind = "a key and member without budgets"
    if args.budget:
        kind = "a key with a budget"
    if args.budgets:
        kind = "a key and member with budgets, a balance alert"
    print(f"PostgreSQL's backends, {args.holds} holds with {kind}, instructions each:")
    print(f"hold        {holding.backends / args.holds / 1e3:8.1f}k")
    print(f"settlement  {settling.backends / args.holds / 1e3:8.1f}k")


def migrated_app(url: str) -> Any:
    """Return the app on ``url``'s database, migrated (the test settings, the built-in model)."""
    from flask_migrate import upgrade

    from app import create_app
    from config.settings import normalize_database_url

    settings = {
        "SQLALCHEMY_DATABASE_URI": normalize_database_url(url),
        "MODEL_CATALOG": str(ROOT / "tests" / "fixtures" / "models.toml"),
    }
    app = create_app("testing", settings)
    with app.app_context():
        upgrade()
    return app


class Ledger:
    """An account with a key, whose holds are placed and settled through the ledger."""

    def __init__(self, key_budget: bool, member_budget_and_alert: bool = False) -> None:
        from app.accounts.budgets import set_key_budget, set_member_budget
        from app.accounts.keys import create_key
        from app.alerts.endpoints import set_balance_threshold
        from app.auth.models import ApiKey
        from app.extensions import db
        from tests.factories import AccountFactory

        account = AccountFactory.create(credits=Decimal(1000))
        self.account_id = account.id
        key = create_key(account_id=account.id, name="counted")
        self.key_id = key.id
        if key_budget:
            set_key_budget(self.key_id, amount=Decimal(500), window="day")
        if member_budget_and_alert:
            # Set, never reached: the alerts' conditions are checked, no event is written.
            member_id = db.session.get(ApiKey, self.key_id).member_id
            set_member_budget(member_id, amount=Decimal(800), window="month")
            set_balance_threshold(self.account_id, Decimal(10))
        db.session.commit()
        self.placed = 0

    def hold(self, count: int) -> list[Any]:
        """Place ``count`` holds, each under a new generation's id."""
        from app.credits.holds import place_hold

        held = []
        for _ in range(count):
            self.placed += 1
            held.append(
                place_hold(
                    account_id=self.account_id,
                    amount=HOLD,
                    ttl_seconds=600,
                    key_id=self.key_id,
                    hold_id=f"chatcmpl-counted-{self.placed}",
                )
            )
        return held

    def settle(self, held: list[Any]) -> None:
        """Settle each hold with its generation's record and rollup."""
        from app.credits.settlement import settle_hold
        from app.generations.lifecycle import rollup_of

        for hold in held:
            record = self.record(hold.id)
            rollup = rollup_of(record[1])
            settle_hold(hold, cost=COST, generation_id=hold.id, record=record, rollup=rollup)

    def record(self, generation_id: str) -> tuple[Any, dict[str, Any]]:
        """Return a chat completion's record, as app.generations.lifecycle writes it."""
        from app.database import utcnow
        from app.generations.lifecycle import INSERT_GENERATION

        prices = {"prompt": "0.5", "completion": "1.5", "cached_read": "0.05", "image": "0.25"}
        row = {
            "id": generation_id,
            "account_id": self.account_id,
            "api_key_id": self.key_id,
            "model": "dev-chat",
            "api": "chat",
            "prompt_tokens": 10,
            "completion_tokens": 20,
            "cached_tokens": 0,
            "prompt_image_tokens": 0,
            "reasoning_tokens": 0,
            "cache_write_tokens": 0,
            **{f"price_{name}": Decimal(price) for name, price in prices.items()},
            "price_cache_write": Decimal(0),
            "status": "completed",
            "finish_reason": "stop",
            "streamed": False,
            "estimated": False,
            "latency_ms": 5,
            "created_at": utcnow(),
            "request_id": "counted",
            "time_to_first_token_ms": None,
            "upstream_attempts": [],
        }
        return INSERT_GENERATION, row

    def close(self) -> None:
        """Close the app's connections, before the server stops."""
        from app.extensions import db

        db.session.remove()
        db.engine.dispose()


if __name__ == "__main__":
    main()
