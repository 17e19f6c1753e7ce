"""Fixtures for the dashboard: headless Chromium, a signed-in test client, page tokens."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from app.accounts.organisations import memberships_of
from app.accounts.passwords import register_account
from app.credits.grants import grant_credits

ROOT = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = ROOT / "test-artifacts"
PASSWORD = "correct horse battery staple"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]


# Module scope: Playwright's sync API keeps an asyncio loop running on this thread while
# it is open, which would break every later test that runs a loop of its own.
@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's chromium, headless, driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser) -> Iterator[object]:
    """A fresh browser context (no cookies) and its page."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(15_000)
    yield context.new_page()
    context.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where screenshots go (gitignored)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def new_email() -> str:
    """A unique email for a test account."""
    return f"holder-{uuid.uuid4().hex[:12]}@example.com"


def csrf_token(html: str) -> str:
    """Return the first CSRF token of a page."""
    match = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', html)
    assert match, "the page has no CSRF token"
    return match.group(1)


def new_key_value(html: str) -> str:
    """Return the key value a creation or rotation page shows."""
    match = re.search(r'id="new-api-key"[^>]*value="(sk-gw-[^"]+)"', html)
    assert match, "the page shows no new key"
    return match.group(1)


def make_holder(app, credits: Decimal = Decimal("5")) -> tuple[int, str]:
    """Create an account that signs in with PASSWORD; return its id and email."""
    email = new_email()
    with app.app_context():
        person = register_account(email=email, password=PASSWORD)
        account = memberships_of(person.id)[0][1]
        if credits:
            grant_credits(account_id=account.id, amount=credits, description="test")
        return account.id, email


def new_client(app) -> FlaskClient:
    """A test client from an address of its own, so sign-in limits per address stay apart."""
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.9"
    return client


def post_form(client: FlaskClient, page: str, path: str, data: dict):
    """Post ``data`` to ``path`` with the CSRF token of the form on ``page``."""
    return client.post(path, data={"csrf_token": csrf_token(client.get(page).text), **data})


def sign_in(client: FlaskClient, email: str, password: str = PASSWORD):
    """Sign ``client`` in through the sign-in form; return the response."""
    token = csrf_token(client.get("/signin").text)
    return client.post("/signin", data={"csrf_token": token, "email": email, "password": password})


@pytest.fixture
def holder_client(app) -> tuple[FlaskClient, int, str]:
    """A test client signed in as a new holder with $5: (client, account id, email)."""
    account_id, email = make_holder(app)
    client = new_client(app)
    assert sign_in(client, email).status_code == 302
    return client, account_id, email
