"""The dashboard in real headless Chromium against the real gunicorn server.

A holder signs up, creates keys, calls the API with the value the page shows, rotates,
revokes, deletes and limits keys, and finds the calls just made, with their cost, on the
usage page and in its CSV export. Screenshots land in test-artifacts/.
"""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal

import pytest
import requests

from app.credits.accounts import find_account_or_raise
from app.credits.grants import grant_credits
from app.dashboard.formatting import format_usd
from tests.dashboard.conftest import PASSWORD, new_email


def ask(server_url: str, key: str, model: str = "dev-chat", **extra) -> requests.Response:
    """One chat completion, as a user's code would send it."""
    return requests.post(
        f"{server_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "messages": [{"role": "user", "content": "Hello there"}], **extra},
        timeout=30,
    )


def cost_of(response: requests.Response) -> Decimal:
    """The USD the gateway says it charged for an answer."""
    return Decimal(str(response.json()["usage"]["cost"]["total_cost"]))


def sign_up(page, url: str) -> str:
    """Create an account through the sign-up form; return its email."""
    email = new_email()
    page.goto(f"{url}/signup")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    page.get_by_role("heading", name="API keys").wait_for()
    return email


def create_key(page, name: str, models: list[str] | None = None, limit: str = "") -> str:
    """Create a key on the keys page; return the value shown once."""
    page.get_by_role("link", name="Keys", exact=True).click()
    page.get_by_label("Key name").fill(name)
    if models:
        page.get_by_label("Permitted models").select_option(models)
    page.get_by_label("Spend limit (USD)").fill(limit)
    page.get_by_role("button", name="Create key").click()
    return shown_value(page)


def shown_value(page) -> str:
    """Read the value in the element labelled New API key."""
    value = page.get_by_label("New API key").input_value()
    assert value.startswith("sk-gw-")
    return value


def key_row(page, name: str):
    """The keys table's row whose first cell is ``name``."""
    page.get_by_role("link", name="Keys", exact=True).click()
    return page.get_by_role("row").filter(has=page.get_by_role("cell", name=name, exact=True))


def manage(page, name: str) -> None:
    """Open the page of the key ``name`` from its row's Manage link."""
    key_row(page, name).get_by_role("link", name=f"Manage {name}", exact=True).click()
    page.get_by_role("heading", name=f"The key “{name}”").wait_for()


def test_a_holder_manages_keys_and_sees_their_usage_in_the_browser(
    app, live_server, page, artifacts
):
    url = live_server.url
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
    console_errors = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    email = sign_up(page, url)
    with app.app_context():
        grant_credits(account_id=find_account_or_raise(email).id, amount=Decimal("5"))
    answered: list[Decimal] = []

    first = create_key(page, "browser key")
    page.screenshot(path=str(artifacts / "key-created.png"), full_page=True)
    page.get_by_role("button", name="Copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == first
    ok = ask(url, first)
    assert ok.status_code == 200
    answered.append(cost_of(ok))

    manage(page, "browser key")
    page.get_by_role("button", name="Rotate").click()
    page.get_by_role("button", name="Rotate").click()
    rotated = shown_value(page)
    assert rotated != first
    assert ask(url, first).status_code == 401
    ok = ask(url, rotated)
    assert ok.status_code == 200
    answered.append(cost_of(ok))

    manage(page, "browser key")
    page.get_by_role("button", name="Revoke").click()
    assert key_row(page, "browser key").get_by_text("revoked").is_visible()
    refused = ask(url, rotated)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "api_key_revoked"

    manage(page, "browser key")
    page.get_by_role("button", name="Delete").click()
    page.get_by_role("button", name="Delete").click()
    assert key_row(page, "browser key").count() == 0
    assert ask(url, rotated).status_code == 401

    mini = create_key(page, "mini only", models=["dev-chat-mini"])
    refused = ask(url, mini, "dev-chat")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_found"
    ok = ask(url, mini, "dev-chat-mini")
    assert ok.status_code == 200
    answered.append(cost_of(ok))
    assert key_row(page, "mini only").get_by_role("cell", name="dev-chat-mini").is_visible()

    capped = create_key(page, "capped")
    manage(page, "capped")
    page.get_by_label("Spend limit (USD)").fill("0.0001")
    page.get_by_role("button", name="Save").click()
    limited = re.compile(r"of \$0\.0001\d* this month$")
    spent = key_row(page, "capped").get_by_role("cell", name=limited)
    assert spent.is_visible()
    statuses = []
    for _ in range(50):
        response = ask(url, capped, "dev-chat-mini", max_tokens=60)
        statuses.append(response.status_code)
        if response.status_code != 200:
            break
        answered.append(cost_of(response))
    assert statuses[0] == 200 and statuses[-1] == 402, statuses
    assert "monthly limit" in response.json()["error"]["message"]

    page.get_by_role("link", name="Keys", exact=True).click()
    fits = "(t => t.scrollWidth <= t.clientWidth)(document.querySelector('.table-scroll'))"
    page.screenshot(path=str(artifacts / "keys.png"), full_page=True)
    assert page.evaluate(fits), "every column of the keys table shows at desktop width"
    page.get_by_role("link", name="Usage", exact=True).click()
    page.get_by_role("heading", name="Generations").wait_for()
    generations_fit = fits.replace(".table-scroll", ".table-scroll:has(table.generations)")
    assert page.evaluate(generations_fit), "every column of the generations shows at desktop width"
    page.screenshot(path=str(artifacts / "usage.png"), full_page=True)
    generations = page.locator("table.generations tbody tr")
    assert generations.count() == len(answered)
    total = sum(answered, Decimal(0))
    by_model = page.get_by_role("region", name="Per model")
    assert by_model.get_by_role("cell", name="dev-chat-mini", exact=True).is_visible()

    with page.expect_download() as download:
        page.get_by_role("link", name="Export CSV").click()
    rows = list(csv.DictReader(io.StringIO(download.value.path().read_text())))
    assert len(rows) == len(answered)
    assert sorted(Decimal(r["cost_usd"]) for r in rows) == sorted(answered)
    assert sum(Decimal(r["cost_usd"]) for r in rows) == total > 0
    assert {r["key"] for r in rows} == {"browser key (deleted)", "mini only", "capped"}

    page.get_by_role("link", name="Balance", exact=True).click()
    assert page.locator("#balance").inner_text() == format_usd(Decimal("5") - total)
    page.set_viewport_size({"width": 390, "height": 844})
    page.get_by_role("link", name="Keys", exact=True).click()
    page.screenshot(path=str(artifacts / "keys-phone.png"), full_page=True)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, "no sideways page"
    assert console_errors == [], "the pages break their own Content-Security-Policy"


@pytest.mark.parametrize("path", ["/keys", "/usage", "/balance", "/quickstart"])
def test_pages_need_a_sign_in(live_server, page, path):
    page.goto(f"{live_server.url}{path}")
    assert page.get_by_role("heading", name="Sign in").is_visible()
