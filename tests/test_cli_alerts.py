"""flask alerts: the balance threshold, webhooks (their secret printed once), e-mail, the log."""

from __future__ import annotations

from decimal import Decimal

from app.alerts.endpoints import active_endpoints, balance_threshold
from app.alerts.secrets import unseal
from tests.factories import AccountFactory


def test_balance_threshold_is_set_shown_and_cleared(app, runner):
    with app.app_context():
        account_id = AccountFactory.create(credits=Decimal("10")).id
    shown = runner.invoke(args=["alerts", "balance", str(account_id), "--below", "2.50"])
    assert shown.exit_code == 0, shown.output
    assert "alert below $2.5" in shown.output
    with app.app_context():
        assert balance_threshold(account_id) == Decimal("2.5")
    assert "alert below $2.5" in runner.invoke(args=["alerts", "balance", str(account_id)]).output
    cleared = runner.invoke(args=["alerts", "balance", str(account_id), "--below", "none"])
    assert "no balance alert" in cleared.output
    with app.app_context():
        assert balance_threshold(account_id) is None
    refused = runner.invoke(args=["alerts", "balance", str(account_id), "--below", "-1"])
    assert refused.exit_code != 0


def test_a_webhook_is_added_listed_without_its_secret_and_removed(app, runner):
    with app.app_context():
        account_id = AccountFactory.create().id
    org = str(account_id)
    added = runner.invoke(args=["alerts", "webhook", "add", org, "https://hooks.example/a"])
    assert added.exit_code == 0, added.output
    *_, label, secret = added.stdout.splitlines()  # a script takes the last line alone
    assert label.startswith("signing secret") and secret.isprintable() and " " not in secret
    with app.app_context():
        [endpoint] = active_endpoints(account_id)
        assert secret not in endpoint.sealed_secret and unseal(endpoint.sealed_secret) == secret
    listed = runner.invoke(args=["alerts", "webhook", "list", org]).output
    assert "https://hooks.example/a" in listed and secret not in listed
    bad = runner.invoke(args=["alerts", "webhook", "add", org, "file:///etc/passwd"])
    assert bad.exit_code == 1 and "http:// or https://" in bad.output
    removed = runner.invoke(args=["alerts", "webhook", "remove", org, str(endpoint.id)])
    assert removed.exit_code == 0, removed.output
    assert runner.invoke(args=["alerts", "webhook", "list", org]).output.endswith(" no webhooks\n")
    again = runner.invoke(args=["alerts", "webhook", "remove", org, str(endpoint.id)])
    assert again.exit_code == 1


def test_email_recipients_are_added_listed_and_removed(app, runner):
    with app.app_context():
        account_id = AccountFactory.create().id
    org = str(account_id)
    added = runner.invoke(args=["alerts", "email", "add", org, "billing@example.com"])
    assert added.exit_code == 0, added.output
    assert "billing@example.com" in runner.invoke(args=["alerts", "email", "list", org]).output
    assert runner.invoke(args=["alerts", "email", "add", org, "a@b.c, d@e.f"]).exit_code == 1
    assert runner.invoke(args=["alerts", "log", org]).output.endswith(" no alert deliveries\n")


def test_the_budget_alert_percentage_is_shown_set_and_cleared(app, runner):
    with app.app_context():
        org = str(AccountFactory.create().id)
    shown = runner.invoke(args=["alerts", "budget", org])
    assert shown.exit_code == 0, shown.output
    assert "alert at 80% of a budget and when a budget is used up" in shown.output
    assert "at 50%" in runner.invoke(args=["alerts", "budget", org, "--percent", "50"]).output
    assert "at 50%" in runner.invoke(args=["alerts", "budget", org]).output
    cleared = runner.invoke(args=["alerts", "budget", org, "--percent", "none"]).output
    assert cleared.endswith(": alert when a budget is used up\n")
    for wrong in ("0", "100", "half"):
        refused = runner.invoke(args=["alerts", "budget", org, "--percent", wrong])
        assert refused.exit_code != 0, wrong
    assert "used up" in runner.invoke(args=["alerts", "budget", org]).output
