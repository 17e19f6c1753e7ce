"""An organisation in real headless Chromium against the real gunicorn server.

An owner invites an admin and a member, who sign up from the links and join; the member
creates a key, uses it, and sees their own usage but not the others'; the owner sees usage
per member; the admin sets the member's budget, and adds a webhook whose delivery log
shows the alert delivered. Each person has a browser context of their own. The wide
tables must fit a 1280 px window: their last column and buttons are checked to lie
inside it. Screenshots land in test-artifacts/.
"""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from app.credits.accounts import find_account_or_raise
from app.credits.grants import grant_credits
from tests.alert_receiver import webhook_receiver
from tests.dashboard.conftest import PASSWORD, new_email
from tests.dashboard.test_browser import ask, create_key, sign_up

WIDTH = 1280


@pytest.fixture
def person(browser):
    """Open browser contexts, one per person, 1280 px wide; closed after the test."""
    contexts = []

    def open_page():
        context = browser.new_context(viewport={"width": WIDTH, "height": 900})
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()


def invite(page, url: str, email: str, role: str) -> str:
    """Invite ``email`` with ``role`` from the members page; return the link shown once."""
    page.goto(f"{url}/members")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Role", exact=True).select_option(role)
    page.get_by_role("button", name="Invite", exact=True).click()
    return page.get_by_role("textbox", name="Invite link").input_value()


def accept(page, link: str, email: str) -> None:
    """Open an invite link as a new person: sign up with its address, come back, join."""
    page.goto(link)
    page.get_by_role("link", name=f"Sign up with {email}").click()
    assert page.get_by_label("Email").input_value() == email
    page.get_by_role("textbox", name="Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    page.get_by_role("button", name="Join").click()
    page.get_by_role("heading", name="API keys").wait_for()


def assert_inside_window(locator) -> None:
    """Every element of ``locator`` ends left of the window's right edge."""
    for index in range(locator.count()):
        box = locator.nth(index).bounding_box()
        assert box is not None and box["x"] + box["width"] <= WIDTH, box


def test_an_owner_invites_and_each_member_sees_what_their_role_allows(
    app, live_server, person, artifacts
):
    url = live_server.url
    owner = person()
    owner_email = sign_up(owner, url)
    with app.app_context():
        grant_credits(account_id=find_account_or_raise(owner_email).id, amount=Decimal("5"))

    admin_email, member_email = new_email(), new_email()
    admin_link = invite(owner, url, admin_email, "admin")
    owner.screenshot(path=str(artifacts / "org-invite-link.png"), full_page=True)
    member_link = invite(owner, url, member_email, "member")
    admin, member = person(), person()
    accept(admin, admin_link, admin_email)
    accept(member, member_link, member_email)

    member_key = create_key(member, "member laptop")
    assert ask(url, member_key).status_code == 200
    owner_key = create_key(owner, "owner server")
    assert ask(url, owner_key).status_code == 200
    admin_key = create_key(admin, "admin ci")
    assert ask(url, admin_key).status_code == 200

    member.get_by_role("link", name="Usage").click()
    assert member.get_by_role("cell", name="member laptop").count() >= 1
    assert member.get_by_role("cell", name="owner server").count() == 0
    assert member.get_by_role("heading", name="Per member").count() == 0
    assert member.get_by_role("link", name="Members").count() == 0
    member.screenshot(path=str(artifacts / "org-member-usage.png"), full_page=True)

    owner.get_by_role("link", name="Usage").click()
    per_member = owner.get_by_role("region", name="Per member")
    for email in (owner_email, admin_email, member_email):
        assert per_member.get_by_role("cell", name=email).count() == 1, email
    assert_inside_window(owner.locator("table.generations th:last-child"))
    owner.screenshot(path=str(artifacts / "org-owner-usage.png"), full_page=True)

    owner.get_by_role("link", name="Keys", exact=True).click()
    for name in ("member laptop", "owner server", "admin ci"):
        assert owner.get_by_role("cell", name=name, exact=True).count() == 1
    assert_inside_window(owner.get_by_role("button", name="Revoke"))
    assert_inside_window(owner.get_by_role("button", name="Delete"))
    owner.screenshot(path=str(artifacts / "org-owner-keys.png"), full_page=True)

    owner.get_by_role("link", name="Members").click()
    members = owner.get_by_role("region", name="Members", exact=True)
    assert members.get_by_role("cell", name=member_email, exact=True).count() == 1
    owner.get_by_role("button", name=f"Remove {member_email}").click()
    assert ask(url, member_key).status_code == 403, "a removed member's key stops at once"
    owner.screenshot(path=str(artifacts / "org-members.png"), full_page=True)
    owner.get_by_role("link", name="Changes").click()
    assert owner.get_by_role("cell", name="member.remove").count() == 1
    owner.screenshot(path=str(artifacts / "org-changes.png"), full_page=True)


def wait_for(condition, seconds: float = 30) -> None:
    """Wait until ``condition()`` holds (the workers' deliverers poll every few seconds)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)


def delivered_row(page, url: str):
    """Reload the Alerts page until its delivery log shows a delivered event; return it."""
    rows = page.get_by_role("region", name="Deliveries").get_by_role("row")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        page.goto(f"{url}/alerts")
        delivered = rows.filter(has_text="balance.below_threshold").filter(has_text="delivered")
        if delivered.count():
            return delivered
        time.sleep(0.5)
    return rows.filter(has_text="balance.below_threshold")


def test_an_admin_sets_a_members_budget_and_an_alert_webhook_logs_its_delivery(
    app, live_server, person, artifacts
):
    url = live_server.url
    owner = person()
    owner_email = sign_up(owner, url)
    with app.app_context():
        organisation_id = find_account_or_raise(owner_email).id
        grant_credits(account_id=organisation_id, amount=Decimal("5"))
    admin_email, member_email = new_email(), new_email()
    admin_link = invite(owner, url, admin_email, "admin")
    member_link = invite(owner, url, member_email, "member")
    admin, member = person(), person()
    accept(admin, admin_link, admin_email)
    accept(member, member_link, member_email)

    admin.get_by_role("link", name="Members").click()
    admin.get_by_label(f"Budget of {member_email} (USD)").fill("0.5")
    admin.get_by_label(f"Window of {member_email}'s budget").select_option("day")
    admin.get_by_role("button", name=f"Save the budget of {member_email}").click()
    budgets = admin.get_by_role("region", name="Budgets")
    assert (
        budgets.get_by_role("row").filter(has_text=member_email).filter(has_text="per day").count()
        == 1
    )
    admin.screenshot(path=str(artifacts / "org-member-budget.png"), full_page=True)

    with webhook_receiver() as receiver:
        admin.get_by_role("link", name="Alerts").click()
        # The balance is $5: the first charge takes it below.
        admin.get_by_label("Alert when the balance falls below (USD)").fill("5")
        admin.get_by_role("button", name="Save the balance alert").click()
        admin.get_by_label("Alert when a budget reaches (% of it)").fill("50")
        admin.get_by_role("button", name="Save the budget alert").click()
        budget_alerts = admin.get_by_role("region", name="Budgets")
        assert budget_alerts.get_by_text("reaches 50% of its window").count() == 1
        admin.get_by_label("Webhook URL or e-mail address").fill(receiver.url)
        admin.get_by_role("button", name="Add").click()
        receiver.secret = admin.get_by_role("textbox", name="Signing secret").input_value()
        admin.screenshot(path=str(artifacts / "org-alert-secret.png"), full_page=True)

        member_key = create_key(member, "member laptop")
        assert ask(url, member_key).status_code == 200
        wait_for(lambda: receiver.events)
        delivered = delivered_row(admin, url)
        admin.screenshot(path=str(artifacts / "org-alert-deliveries.png"), full_page=True)

    assert [event["type"] for event in receiver.events] == ["balance.below_threshold"]
    assert receiver.bad_signatures == 0
    assert receiver.events[0]["data"]["organisation_id"] == organisation_id
    assert delivered.count() == 1
    assert member.get_by_role("link", name="Alerts").count() == 0
