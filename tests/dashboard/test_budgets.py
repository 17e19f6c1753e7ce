"""Budgets in the dashboard: an admin sets a member's budget, a key's limit takes a window."""

from __future__ import annotations

from decimal import Decimal

from app.accounts.models import Membership
from app.auth.models import ApiKey
from app.extensions import db
from tests.dashboard.conftest import csrf_token, post_form
from tests.dashboard.test_organisations import ask, create_key, team  # noqa: F401


def budget_of(app, model, row_id: int) -> tuple:
    with app.app_context():
        row = db.session.get(model, row_id)
        return row.budget, row.budget_window


def test_an_admin_sets_a_members_budget_which_stops_their_keys(app, team):  # noqa: F811
    owner, admin, member = team
    _, value = create_key(member.client, "budgeted")
    saved = post_form(
        admin.client,
        "/members",
        f"/members/{member.member_id}/budget",
        {"amount": "0", "window": "week"},
    )
    assert saved.status_code == 302
    assert budget_of(app, Membership, member.member_id) == (Decimal("0"), "week")
    page = admin.client.get("/members").text
    assert f"Budget of {member.email} (USD)" in page and "per week" in page
    assert ask(app, value) == 402

    cleared = post_form(
        admin.client, "/members", f"/members/{member.member_id}/budget", {"amount": ""}
    )
    assert cleared.status_code == 302
    assert budget_of(app, Membership, member.member_id) == (None, "month")
    assert ask(app, value) == 200


def test_a_member_cannot_set_budgets_and_bad_amounts_are_refused(app, team):  # noqa: F811
    owner, admin, member = team
    token = csrf_token(member.client.get("/keys").text)
    path = f"/members/{member.member_id}/budget"
    refused = member.client.post(path, data={"csrf_token": token, "amount": "5"})
    assert refused.status_code == 403
    bad = post_form(admin.client, "/members", path, {"amount": "-3", "window": "day"})
    assert bad.status_code == 302
    assert "Enter zero or a positive amount." in admin.client.get("/members").text
    assert budget_of(app, Membership, member.member_id) == (None, "month")
    other = post_form(admin.client, "/members", "/members/999999/budget", {"amount": "1"})
    assert other.status_code == 404


def test_a_keys_limit_is_counted_in_the_window_chosen(app, team):  # noqa: F811
    owner, _, _ = team
    key_id, _ = create_key(owner.client, "daily")
    edited = post_form(
        owner.client,
        f"/keys/{key_id}/edit",
        f"/keys/{key_id}/edit",
        {"monthly_limit": "1.5", "limit_window": "day"},
    )
    assert edited.status_code == 302, edited.text
    assert budget_of(app, ApiKey, key_id) == (Decimal("1.5"), "day")
    form = owner.client.get(f"/keys/{key_id}/edit").text
    assert '<option selected value="day">' in form or 'value="day" selected' in form
