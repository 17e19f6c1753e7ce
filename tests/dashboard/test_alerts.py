"""The Alerts page: owners and admins set the threshold, add endpoints, read the log."""

from __future__ import annotations

import re
from decimal import Decimal

from app.alerts.endpoints import active_endpoints, balance_threshold, budget_alert_percent
from app.alerts.secrets import unseal
from tests.dashboard.conftest import csrf_token, post_form
from tests.dashboard.test_organisations import _account_of, team  # noqa: F401  (a fixture)


def test_only_owners_and_admins_see_alerts(app, team):  # noqa: F811
    owner, admin, member = team
    assert member.client.get("/alerts").status_code == 403
    assert admin.client.get("/alerts").status_code == 200
    token = csrf_token(member.client.get("/keys").text)
    refused = member.client.post("/alerts/balance", data={"csrf_token": token, "below": "1"})
    assert refused.status_code == 403


def test_threshold_webhook_secret_once_email_and_removal(app, team):  # noqa: F811
    owner, _, _ = team
    account_id = _account_of(app, owner.email)
    saved = post_form(owner.client, "/alerts", "/alerts/balance", {"below": "2.5"})
    assert saved.status_code == 302
    with app.app_context():
        assert balance_threshold(account_id) == Decimal("2.5")
    bad = post_form(owner.client, "/alerts", "/alerts/balance", {"below": "lots"})
    assert bad.status_code == 400 and "positive amount" in bad.text

    added = post_form(
        owner.client, "/alerts", "/alerts/endpoints", {"target": "https://h.example/x"}
    )
    assert added.status_code == 201
    secret = re.search(r'id="webhook-secret" readonly value="([^"]+)"', added.text).group(1)
    assert secret not in owner.client.get("/alerts").text
    with app.app_context():
        [webhook] = active_endpoints(account_id)
        assert unseal(webhook.sealed_secret) == secret

    assert (
        post_form(
            owner.client, "/alerts", "/alerts/endpoints", {"target": "a@b.example"}
        ).status_code
        == 302
    )
    assert (
        post_form(owner.client, "/alerts", "/alerts/endpoints", {"target": "nope"}).status_code
        == 400
    )
    page = owner.client.get("/alerts").text
    assert "https://h.example/x" in page and "a@b.example" in page
    removed = post_form(owner.client, "/alerts", f"/alerts/endpoints/{webhook.id}/remove", {})
    assert removed.status_code == 302
    assert "https://h.example/x" not in owner.client.get("/alerts").text
    gone = post_form(owner.client, "/alerts", f"/alerts/endpoints/{webhook.id}/remove", {})
    assert gone.status_code == 404


def test_the_budget_alert_percentage_is_set_on_the_alerts_page(app, team):  # noqa: F811
    owner, _, member = team
    account_id = _account_of(app, owner.email)
    assert "reaches 80% of its window" in owner.client.get("/alerts").text
    saved = post_form(owner.client, "/alerts", "/alerts/budgets", {"percent": "65"})
    assert saved.status_code == 302
    with app.app_context():
        assert budget_alert_percent(account_id) == 65
    assert "reaches 65% of its window" in owner.client.get("/alerts").text
    for wrong in ("100", "most"):
        bad = post_form(owner.client, "/alerts", "/alerts/budgets", {"percent": wrong})
        assert bad.status_code == 400 and "from 1 to 99" in bad.text
    cleared = post_form(owner.client, "/alerts", "/alerts/budgets", {"percent": ""})
    assert cleared.status_code == 302
    with app.app_context():
        assert budget_alert_percent(account_id) is None
    token = csrf_token(member.client.get("/keys").text)
    refused = member.client.post("/alerts/budgets", data={"csrf_token": token, "percent": "5"})
    assert refused.status_code == 403
    with app.app_context():
        assert budget_alert_percent(account_id) is None
