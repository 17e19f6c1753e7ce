"""Factories for test data, built through the domain so the ledger stays consistent."""

from __future__ import annotations

import uuid
from decimal import Decimal

import factory

from app.accounts.keys import IssuedKey, create_key
from app.accounts.organisations import create_account
from app.credits.grants import grant_credits
from app.credits.models import Account


class AccountFactory(factory.Factory):
    """An account; its credits arrive as a ledger grant, as in production."""

    class Meta:
        model = Account

    email = factory.LazyFunction(lambda: f"user-{uuid.uuid4().hex[:12]}@example.com")

    @classmethod
    def _create(
        cls, model_class: type[Account], email: str, credits: Decimal = Decimal(0)
    ) -> Account:
        account = create_account(email=email)
        if credits:
            grant_credits(account_id=account.id, amount=credits, description="test")
        return account

    @classmethod
    def with_key(
        cls, credits: Decimal = Decimal("10"), name: str = "test"
    ) -> tuple[Account, IssuedKey]:
        """An account with ``credits`` and one active key."""
        account = cls.create(credits=credits)
        return account, create_key(account_id=account.id, name=name)
