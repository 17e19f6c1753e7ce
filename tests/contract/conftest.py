"""Clients for the contract tests: the official openai SDK against the live server."""

from __future__ import annotations

import openai
import pytest
import requests
from sqlalchemy import select

from app.credits.models import Account, Hold, LedgerEntry
from app.extensions import db
from app.generations.models import Generation


@pytest.fixture
def make_client(live_server):
    """``make_client(key)``: an OpenAI SDK client pointed at the gateway, without retries."""

    def make(key: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{live_server.url}/v1", api_key=key, max_retries=0, timeout=30
        )

    return make


@pytest.fixture
def sdk(make_client, funded_key) -> openai.OpenAI:
    """An SDK client with a funded key."""
    return make_client(funded_key.key)


def open_slow_stream(base_url: str, key: str, words: int = 300) -> requests.Response:
    """Start a long stream from dev-slow (one token every 50 ms) and return it unread."""
    prompt = " ".join(f"w{i}" for i in range(words))
    return requests.post(
        f"{base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "dev-slow",
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
        },
        stream=True,
        timeout=30,
    )


def billing_records(app, account_id: int) -> tuple:
    """Return the account and its generations, charges and holds, as the database has them."""
    with app.app_context():
        db.session.expire_all()
        account = db.session.get(Account, account_id)
        generations = db.session.scalars(
            select(Generation).where(Generation.account_id == account_id)
        ).all()
        charges = db.session.scalars(
            select(LedgerEntry).where(
                LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge"
            )
        ).all()
        holds = db.session.scalars(select(Hold).where(Hold.account_id == account_id)).all()
        return account, generations, charges, holds
