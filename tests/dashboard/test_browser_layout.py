"""The dashboard's pages laid out at 1280x800 and on a 390x844 phone, in real Chromium.

Each page is screenshot at both widths into test-artifacts/ and checked: no table,
button, link-button or field leaves its card, and the page does not scroll sideways.
Beside the layout: the header names the person and the organisation once each, each
key's row is one line that names its limit's window, amounts shown together share their
decimals, a form's error is in view, and the operator tells alike organisations apart.
"""

from __future__ import annotations

import re
import uuid
from decimal import Decimal

from app.accounts.keys import create_key as issue_key
from app.accounts.members import organisations_named
from app.accounts.models import Person
from app.accounts.organisations import find_person_by_email, stage_account
from app.accounts.passwords import register_account
from app.credits.accounts import find_account_or_raise
from app.credits.grants import grant_credits
from app.extensions import db
from tests.dashboard.conftest import PASSWORD, new_email
from tests.dashboard.test_browser import ask, create_key, key_row, sign_up
from tests.dashboard.test_browser_organisations import invite

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

# Every card's tables, buttons, link-buttons and fields whose box is not inside the
# card's (a pixel of rounding allowed), named so a failure says which.
OUTSIDE_THEIR_CARD = """() => {
  const out = [];
  for (const card of document.querySelectorAll('.card, .stat')) {
    const c = card.getBoundingClientRect();
    for (const el of card.querySelectorAll('table, button, .button-link, input, select')) {
      if (el.type === 'hidden' || el.closest('.visually-hidden')) continue;
      const b = el.getBoundingClientRect();
      if (b.width === 0 && b.height === 0) continue;
      const inside = b.left >= c.left - 1 && b.right <= c.right + 1
        && b.top >= c.top - 1 && b.bottom <= c.bottom + 1;
      if (!inside) {
        const what = (el.innerText || el.value || el.name || '').slice(0, 40);
        const span = r => `x ${r.left | 0}..${r.right | 0} y ${r.top | 0}..${r.bottom | 0}`;
        out.push(`${el.tagName} "${what}" ${span(b)} in a card ${span(c)}`);
      }
    }
  }
  return out;
}"""
CARDS = "document.querySelectorAll('.card').length"
DECIMALS = re.compile(r"\$\d+\.(\d+)")


def check_both_widths(page, name: str, artifacts) -> None:
    """Screenshot the page at desktop and phone width; nothing may leave its card."""
    for label, viewport in (("", DESKTOP), ("-phone", PHONE)):
        page.set_viewport_size(viewport)
        page.screenshot(path=str(artifacts / f"layout-{name}{label}.png"), full_page=True)
        assert page.evaluate(CARDS) > 0, f"{name}: the page has no card to check"
        assert page.evaluate(OUTSIDE_THEIR_CARD) == [], f"{name} at {viewport['width']} px"
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"], f"{name} scrolls sideways at {viewport['width']} px"
    page.set_viewport_size(DESKTOP)


def decimals_of(texts: list[str]) -> set[int]:
    """Return how many decimals the dollar amounts in ``texts`` are written with."""
    return {len(found) for text in texts for found in DECIMALS.findall(text)}


def open_page(browser, viewport=DESKTOP):
    """A fresh browser context of its own, 1280x800 unless told."""
    context = browser.new_context(viewport=viewport)
    context.set_default_timeout(15_000)
    return context, context.new_page()


def choose_window(page, name: str, limit: str, window: str) -> None:
    """Create the key ``name`` limited to ``limit`` USD per ``window`` on the keys page."""
    page.get_by_role("link", name="Keys", exact=True).click()
    page.get_by_label("Key name").fill(name)
    page.get_by_label("Spend limit (USD)").fill(limit)
    page.get_by_label("Limit window").select_option(label=window)
    page.get_by_role("button", name="Create key").click()
    page.get_by_label("New API key").wait_for()


def test_a_holders_pages_fit_their_cards_and_name_things_once(app, live_server, browser, artifacts):
    url = live_server.url
    context, page = open_page(browser)
    email = sign_up(page, url)
    with app.app_context():
        grant_credits(account_id=find_account_or_raise(email).id, amount=Decimal("5"))

    header = page.locator("header.site-header").inner_text()
    assert header.count(email) == 1, header
    assert "your personal organisation (owner)" in header

    first = create_key(page, "unlimited")
    assert ask(url, first).status_code == 200
    choose_window(page, "weekly", "2", "per week")
    choose_window(page, "five hours", "0.5", "per 5 hours")
    choose_window(page, "monthly", "3", "per month")
    page.get_by_role("link", name="Keys", exact=True).click()
    spent = {
        name: key_row(page, name).locator("td[data-label='Spent of limit']").inner_text()
        for name in ("unlimited", "weekly", "five hours", "monthly")
    }
    assert spent["unlimited"].endswith("this month, no limit"), spent
    assert re.search(r"of \$2\.0+ this week$", spent["weekly"]), spent
    assert re.search(r"of \$0\.50* in 5 hours$", spent["five hours"]), spent
    assert re.search(r"of \$3\.0+ this month$", spent["monthly"]), spent
    assert len(decimals_of(list(spent.values()))) == 1, spent
    assert page.get_by_role("columnheader", name="Monthly limit").count() == 0

    # One line a row: no cell wraps, the member's address included.
    rows = page.locator("table.keys tbody tr")
    for index in range(rows.count()):
        assert rows.nth(index).bounding_box()["height"] < 52, rows.nth(index).inner_text()
    member_lines = page.evaluate(
        """() => [...document.querySelectorAll('table.keys td[data-label=Member]')].map(td => {
             const range = document.createRange(); range.selectNodeContents(td);
             return range.getClientRects().length; })"""
    )
    assert member_lines and set(member_lines) == {1}, member_lines
    check_both_widths(page, "keys", artifacts)

    key_row(page, "weekly").get_by_role("link", name="Manage weekly").click()
    page.get_by_role("heading", name="The key “weekly”").wait_for()
    assert page.get_by_role("button", name="Rotate").is_visible()
    assert page.get_by_role("button", name="Revoke").is_visible()
    assert page.get_by_role("button", name="Delete").is_visible()
    assert page.get_by_label("Limit window").input_value() == "week"
    check_both_widths(page, "key", artifacts)

    page.get_by_role("link", name="Usage", exact=True).click()
    costs = page.locator("table.generations td[data-label=Cost]").all_inner_texts()
    assert costs and len(decimals_of(costs)) == 1, costs
    ticks = page.locator("svg text.axis").all_text_contents()
    tick_amounts = [tick for tick in ticks if tick.startswith("$")]
    assert len(tick_amounts) == 3 and len(decimals_of(tick_amounts)) == 1, ticks
    check_both_widths(page, "usage", artifacts)

    page.get_by_role("link", name="Balance", exact=True).click()
    figures = page.locator(".stat-value").all_inner_texts()
    assert len(decimals_of(figures)) == 1, figures
    ledger = page.locator("td[data-label=Amount]").all_inner_texts()
    assert len(ledger) == 2 and len(decimals_of(ledger)) == 1, ledger
    check_both_widths(page, "balance", artifacts)

    invitee = new_email()
    link = invite(page, url, invitee, "member")
    pending = page.get_by_role("region", name="Pending invites")
    assert pending.get_by_role("cell", name=invitee, exact=True).count() == 1
    assert pending.get_by_role("button", name=f"Revoke the invite of {invitee}").is_visible()
    assert page.get_by_role("heading", name="Members of your personal organisation").is_visible()
    check_both_widths(page, "members", artifacts)

    stranger_context, stranger = open_page(browser)
    stranger.goto(link)
    heading = f"Join {email}'s organisation"
    assert stranger.get_by_role("heading", name=heading).is_visible()
    assert "owner of" not in stranger.locator("main").inner_text()
    check_both_widths(stranger, "invite", artifacts)
    stranger_context.close()

    page.goto(f"{url}/organisations")
    check_both_widths(page, "organisations", artifacts)
    context.close()


def test_a_forms_error_below_the_fold_is_brought_into_view_and_focused(
    app, live_server, browser, artifacts
):
    url = live_server.url
    context, page = open_page(browser)
    email = sign_up(page, url)
    with app.app_context():
        account_id = find_account_or_raise(email).id
        for number in range(12):
            issue_key(account_id=account_id, name=f"key {number}")

    page.get_by_role("link", name="Keys", exact=True).click()
    page.get_by_label("Key name").fill("too much")
    page.get_by_label("Spend limit (USD)").fill("-1")
    page.get_by_role("button", name="Create key").click()

    error = page.locator("#monthly_limit-error")
    assert error.inner_text() == "Enter zero or a positive amount."
    below_the_fold = page.evaluate(
        "document.getElementById('monthly_limit-error').getBoundingClientRect().top"
        " + window.scrollY"
    )
    assert below_the_fold > DESKTOP["height"], "the form must start below the fold"
    box = error.bounding_box()
    assert 0 <= box["y"] and box["y"] + box["height"] <= DESKTOP["height"], box
    assert page.evaluate("document.activeElement.id") == "monthly_limit"
    page.screenshot(path=str(artifacts / "layout-form-error.png"))
    context.close()


def _make_operator(app) -> str:
    """A person with the operator flag who signs in with PASSWORD; return their email."""
    email = new_email()
    with app.app_context():
        person = register_account(email=email, password=PASSWORD)
        db.session.get(Person, person.id).is_admin = True
        db.session.commit()
    return email


def test_the_operator_tells_alike_organisations_apart_and_a_taken_name_is_refused(
    app, live_server, browser, artifacts
):
    url = live_server.url
    operator = _make_operator(app)
    name = f"Alike {uuid.uuid4().hex[:6]}"
    with app.app_context():
        # Two organisations named alike, as the service allowed before names had to differ.
        owner = find_person_by_email(operator)
        ids = [stage_account(email=None, name=name, owner=owner).id for _ in range(2)]
        db.session.commit()

    context, page = open_page(browser)
    page.goto(f"{url}/signin")
    page.get_by_label("Email").fill(operator)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("link", name="All organisations").click()
    assert page.get_by_role("heading", name="All organisations", exact=True).is_visible()
    assert page.title().startswith("All organisations")
    for account_id in ids:
        id_cell = page.get_by_role("cell", name=str(account_id), exact=True)
        row = page.get_by_role("row").filter(has=id_cell)
        assert row.get_by_role("cell", name=name, exact=True).count() == 1
        assert row.get_by_role("button", name=f"Grant to {name} (id {account_id})").is_visible()
    check_both_widths(page, "operator", artifacts)

    page.goto(f"{url}/organisations")
    page.get_by_label("Name").fill(f"  {name.upper()} ")
    page.get_by_role("button", name="Make organisation").click()
    assert page.locator("#name-error").inner_text() == "That name is taken: choose another."
    assert page.evaluate("document.activeElement.id") == "name"
    check_both_widths(page, "organisation-taken", artifacts)
    with app.app_context():
        assert [account.id for account in organisations_named(name)] == ids
    context.close()
