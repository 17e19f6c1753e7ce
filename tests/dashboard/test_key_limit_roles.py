"""A key's spend limit set by an owner, an admin or the operator: its member may only lower it."""

from __future__ import annotations

from decimal import Decimal

from app.auth.models import ApiKey
from app.extensions import db
from tests.dashboard.conftest import post_form
from tests.dashboard.test_budgets import budget_of
from tests.dashboard.test_organisations import create_key, team  # noqa: F401


def edit(client, key_id: int, limit: str, window: str = "month"):
    page = f"/keys/{key_id}/edit"
    return post_form(client, page, page, {"monthly_limit": limit, "limit_window": window})


def test_a_member_lowers_but_cannot_raise_or_remove_a_limit_an_admin_set(app, team):  # noqa: F811
    _, admin, member = team
    key_id, _ = create_key(member.client, "laptop")
    assert edit(admin.client, key_id, "5").status_code == 302

    for limit, window in (("10", "month"), ("", "month"), ("5", "day"), ("5.000001", "month")):
        refused = edit(member.client, key_id, limit, window)
        assert refused.status_code == 400, (limit, window)
        assert "only they may raise it, remove it or change its window" in refused.text
        assert budget_of(app, ApiKey, key_id) == (Decimal("5"), "month")

    assert edit(member.client, key_id, "5").status_code == 302  # saved unchanged
    assert edit(member.client, key_id, "3").status_code == 302
    assert budget_of(app, ApiKey, key_id) == (Decimal("3"), "month")
    assert edit(member.client, key_id, "4").status_code == 400
    assert budget_of(app, ApiKey, key_id) == (Decimal("3"), "month")

    assert edit(admin.client, key_id, "10", "week").status_code == 302
    assert budget_of(app, ApiKey, key_id) == (Decimal("10"), "week")
    assert edit(admin.client, key_id, "").status_code == 302
    assert budget_of(app, ApiKey, key_id) == (None, "month")


def test_a_member_changes_a_limit_they_set_themselves_as_they_like(app, team):  # noqa: F811
    owner, _, member = team
    key_id, _ = create_key(member.client, "own")

    assert edit(member.client, key_id, "2").status_code == 302
    assert edit(member.client, key_id, "7", "day").status_code == 302
    assert budget_of(app, ApiKey, key_id) == (Decimal("7"), "day")
    assert edit(member.client, key_id, "", "day").status_code == 302
    assert budget_of(app, ApiKey, key_id) == (None, "day")

    assert edit(owner.client, key_id, "1").status_code == 302
    assert edit(member.client, key_id, "").status_code == 400
    assert budget_of(app, ApiKey, key_id) == (Decimal("1"), "month")


def test_a_limit_the_operator_set_is_locked_for_the_member_too(app, runner, team):  # noqa: F811
    owner, _, member = team
    key_id, _ = create_key(member.client, "ci")
    with app.app_context():
        account_id = str(db.session.get(ApiKey, key_id).account_id)
    set_by_cli = runner.invoke(
        args=["orgs", "budget", account_id, "--key", str(key_id), "--usd", "4"]
    )
    assert set_by_cli.exit_code == 0, set_by_cli.output

    assert edit(member.client, key_id, "9").status_code == 400
    assert edit(member.client, key_id, "").status_code == 400
    assert edit(member.client, key_id, "1").status_code == 302
    assert budget_of(app, ApiKey, key_id) == (Decimal("1"), "month")
