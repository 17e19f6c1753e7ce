"""Clients for the contract tests: the official openai SDK against the live server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import requests
from sqlalchemy import select

from app.catalog.registry import Catalog, load_catalog
from app.credits.models import Account, Hold, LedgerEntry
from app.extensions import db
from app.generations.models import Generation
from tests.conftest import running_server
from tests.upstream_server import ReplayServer


@dataclass(frozen=True)
class Gateway:
    """A gateway running on a catalog of its own: its URL, that catalog, its log file."""

    url: str
    catalog: Catalog
    log: Path


@pytest.fixture(scope="module")
def upstream() -> Iterator[ReplayServer]:
    """The replay server that the upstreams of a module's catalog point at."""
    server = ReplayServer()
    yield server
    server.close()


@contextmanager
def gateway_serving(
    catalog_text: str, database_url: str, folder: Path, **env: str
) -> Iterator[Gateway]:
    """Run gunicorn in ``folder`` on a catalog of ``catalog_text``; ``env`` adds variables."""
    catalog = folder / "models.toml"
    catalog.write_text(catalog_text)
    with running_server(database_url, folder, catalog=str(catalog), **env) as server:
        yield Gateway(server.url, load_catalog(catalog), next(folder.glob("gunicorn-*.log")))


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
