"""The dashboard's pages through the test client: other people's data, CSRF, bad input."""

from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy import func, select

from app import create_app
from app.accounts.keys import create_key
from app.accounts.models import Person
from app.auth.models import ApiKey
from app.credits.grants import grant_credits
from app.credits.models import Account, LedgerEntry
from app.database import utcnow
from app.extensions import db
from app.generations.models import Generation
from tests.conftest import TEST_CATALOG
from tests.dashboard.conftest import (
    PASSWORD,
    csrf_token,
    make_holder,
    new_client,
    new_email,
    new_key_value,
    post_form,
    sign_in,
)


def key_state(app, key_id: int) -> tuple | None:
    """The key's row as the database has it, or None if it is gone."""
    with app.app_context():
        row = db.session.execute(
            select(ApiKey.state, ApiKey.digest, ApiKey.permitted_models, ApiKey.budget).where(
                ApiKey.id == key_id
            )
        ).first()
        return tuple(row) if row else None


def count_keys(app, account_id: int) -> int:
    with app.app_context():
        return db.session.scalar(
            select(func.count(ApiKey.id)).where(ApiKey.account_id == account_id)
        )


def record_generation(app, account_id: int, key_id: int, model: str, cost: str) -> None:
    """A generation record, as a settled request leaves it."""
    with app.app_context():
        db.session.add(
            Generation(
                id=f"gen-{key_id}-{model}-{cost}",
                account_id=account_id,
                api_key_id=key_id,
                model=model,
                prompt_tokens=3,
                completion_tokens=4,
                cost=Decimal(cost),
                status="completed",
                created_at=utcnow(),
            )
        )
        db.session.commit()


@pytest.fixture
def other_holders_key(app) -> tuple[int, int]:
    """Another account with a key and a generation: (account id, key id)."""
    account_id, email = make_holder(app)
    with app.app_context():
        issued = create_key(account_id=account_id, name="theirs")
    record_generation(app, account_id, issued.id, "dev-chat", "0.123")
    return account_id, issued.id


@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/keys/{id}/edit"),
        ("get", "/keys/{id}/rotate"),
        ("get", "/keys/{id}/delete"),
        ("post", "/keys/{id}/edit"),
        ("post", "/keys/{id}/rotate"),
        ("post", "/keys/{id}/revoke"),
        ("post", "/keys/{id}/delete"),
    ],
)
def test_another_accounts_key_is_a_404_and_stays_as_it_was(
    app, holder_client, other_holders_key, method, path
):
    client, _, _ = holder_client
    _, key_id = other_holders_key
    before = key_state(app, key_id)
    token = csrf_token(client.get("/keys").text)
    data = {"csrf_token": token, "monthly_limit": "1", "permitted_models": ["dev-chat"]}
    response = getattr(client, method)(path.format(id=key_id), data=data)
    assert response.status_code == 404
    assert "sk-gw-" not in response.text
    assert key_state(app, key_id) == before


def test_usage_ledger_and_csv_show_only_the_accounts_own_records(
    app, holder_client, other_holders_key
):
    client, account_id, email = holder_client
    _, their_key = other_holders_key
    with app.app_context():
        mine = create_key(account_id=account_id, name="mine")
    record_generation(app, account_id, mine.id, "dev-chat-mini", "0.0042")

    usage = client.get("/usage").text
    assert "$0.0042" in usage and "$0.123" not in usage and "theirs" not in usage
    assert client.get(f"/usage?key={their_key}").text.count("<tbody>") == 0
    exported = client.get("/usage.csv").text.splitlines()
    assert len(exported) == 2 and "0.0042" in exported[1]
    assert client.get(f"/usage.csv?key={their_key}").text.splitlines()[1:] == []
    balance = client.get("/balance").text
    assert "$5.00" in balance and "$0.123" not in balance


def test_usage_filters_and_csv_follow_the_url(app, holder_client):
    client, account_id, email = holder_client
    with app.app_context():
        first = create_key(account_id=account_id, name="first")
        second = create_key(account_id=account_id, name="second")
    record_generation(app, account_id, first.id, "dev-chat", "0.5")
    record_generation(app, account_id, second.id, "dev-chat-mini", "0.25")

    page = client.get(f"/usage?key={second.id}&model=dev-chat-mini").text
    assert f'href="/usage.csv?key={second.id}&amp;model=dev-chat-mini"' in page
    rows = client.get(f"/usage.csv?key={second.id}").text.splitlines()
    assert len(rows) == 2 and ",second," in rows[1] and ",0.25" in rows[1]
    assert client.get("/usage.csv?model=dev-chat").text.count("\n") == 2
    today = utcnow().date()
    assert client.get(f"/usage.csv?to={today.replace(year=today.year - 1)}").text.count("\n") == 1


@pytest.mark.parametrize(
    "path, data",
    [
        ("/keys", {"name": "sneaky"}),
        ("/signout", {}),
        ("/signin", {"email": "a@example.com", "password": PASSWORD}),
    ],
)
def test_a_form_without_its_csrf_token_is_a_400(app, holder_client, path, data):
    client, account_id, _ = holder_client
    response = client.post(path, data=data)
    assert response.status_code == 400
    assert count_keys(app, account_id) == 0
    assert client.get("/keys").status_code == 200, "still signed in"


def test_a_revoke_without_its_csrf_token_is_a_400_and_the_key_stays_active(app, holder_client):
    client, account_id, email = holder_client
    with app.app_context():
        issued = create_key(account_id=account_id, name="kept")
    response = client.post(f"/keys/{issued.id}/revoke", data={"csrf_token": "forged"})
    assert response.status_code == 400
    assert key_state(app, issued.id)[0] == "active"


@pytest.mark.parametrize(
    "data, message",
    [
        ({"name": "  "}, "This field is required."),
        ({"name": "k", "permitted_models": ["no-such-model"]}, "Unknown model id"),
        ({"name": "k", "monthly_limit": "-1"}, "Enter zero or a positive amount."),
        ({"name": "k", "monthly_limit": "ten"}, "Enter an amount in USD"),
        ({"name": "k", "monthly_limit": "0.0000001"}, "more than 6 decimal places"),
    ],
)
def test_a_bad_key_form_comes_back_with_the_fields_error(app, holder_client, data, message):
    client, account_id, _ = holder_client
    response = post_form(client, "/keys", "/keys", data)
    assert response.status_code == 400
    assert message in response.text
    assert 'aria-invalid="true"' in response.text
    assert count_keys(app, account_id) == 0


def test_a_key_is_created_with_its_limits_and_shown_once(app, holder_client):
    client, account_id, _ = holder_client
    response = post_form(
        client,
        "/keys",
        "/keys",
        {"name": "limited", "permitted_models": ["dev-chat-mini"], "monthly_limit": "2.5"},
    )
    assert response.status_code == 201
    value = new_key_value(response.text)
    assert response.headers["Cache-Control"] == "no-store"
    listing = client.get("/keys").text
    assert value not in listing and value[:12] in listing
    with app.app_context():
        key = db.session.scalar(select(ApiKey).where(ApiKey.account_id == account_id))
        assert key.permitted_models == ["dev-chat-mini"] and key.budget == Decimal("2.5")


def test_editing_limits_saves_them_or_changes_nothing(app, holder_client):
    client, account_id, email = holder_client
    with app.app_context():
        issued = create_key(account_id=account_id, name="edited", monthly_limit=Decimal("3"))
    path = f"/keys/{issued.id}/edit"
    bad = post_form(client, path, path, {"monthly_limit": "-2", "permitted_models": ["dev-chat"]})
    assert bad.status_code == 400 and "Enter zero or a positive amount." in bad.text
    assert key_state(app, issued.id)[2:] == (None, Decimal("3"))
    good = post_form(client, path, path, {"monthly_limit": "", "permitted_models": ["dev-chat"]})
    assert good.status_code == 302
    assert key_state(app, issued.id)[2:] == (["dev-chat"], None)


def test_dashboard_pages_carry_the_security_headers(holder_client):
    client, _, _ = holder_client
    for path in ("/keys", "/usage", "/balance", "/quickstart", "/signin"):
        headers = client.get(path).headers
        csp = headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "frame-ancestors 'none'" in csp
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["Referrer-Policy"] == "same-origin"
        assert headers["Cache-Control"] == "no-store"


def test_the_session_cookie_is_httponly_and_lax(app):
    account_id, email = make_holder(app)
    response = sign_in(new_client(app), email)
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie


def test_a_wrong_email_or_password_gets_one_message(app):
    _, email = make_holder(app)
    wrong_password = sign_in(new_client(app), email, "not the password at all")
    unknown_email = sign_in(new_client(app), new_email())
    for response in (wrong_password, unknown_email):
        assert response.status_code == 401
        assert "Incorrect email or password." in response.text
    assert wrong_password.text.count("error") == unknown_email.text.count("error")


def test_sign_in_is_case_blind_and_sign_out_ends_the_session(app):
    _, email = make_holder(app)
    client = new_client(app)
    assert sign_in(client, email.upper()).status_code == 302
    assert client.get("/keys").status_code == 200
    assert post_form(client, "/keys", "/signout", {}).status_code == 302
    assert client.get("/keys").headers["Location"].startswith("/signin")


def test_sign_in_attempts_are_limited_per_email(app):
    _, email = make_holder(app)
    statuses = [sign_in(new_client(app), email, "wrong password!").status_code for _ in range(5)]
    assert statuses == [401] * 5
    refused = sign_in(new_client(app), email)
    assert refused.status_code == 429 and "Too many sign-in attempts" in refused.text
    assert sign_in(new_client(app), new_email()).status_code == 401, "other emails go on"


def test_sign_in_attempts_are_limited_per_address(app):
    client = new_client(app)
    statuses = [sign_in(client, new_email()).status_code for _ in range(21)]
    assert statuses == [401] * 20 + [429]


def test_pages_past_the_rate_limit_are_refused_with_a_page_but_not_static_files(database_url):
    overrides = {"SQLALCHEMY_DATABASE_URI": database_url, "MODEL_CATALOG": TEST_CATALOG}
    app = create_app("testing", {**overrides, "RATE_LIMIT": "2 per minute"})
    client = new_client(app)
    statuses = [client.get("/").status_code for _ in range(3)]
    refused = client.get("/")
    stylesheets = [client.get("/dashboard/static/dashboard.css").status_code for _ in range(3)]

    assert statuses == [302, 302, 429]
    assert refused.status_code == 429 and "Too many requests from your address" in refused.text
    assert stylesheets == [200] * 3


def test_sign_up_refuses_a_duplicate_email_and_a_short_password(app):
    _, email = make_holder(app)
    client = new_client(app)
    duplicate = post_form(
        client, "/signup", "/signup", {"email": email.upper(), "password": PASSWORD}
    )
    assert duplicate.status_code == 400
    assert "This address cannot be signed up here." in duplicate.text
    assert "already exists" not in duplicate.text
    fresh = new_email()
    short = post_form(client, "/signup", "/signup", {"email": fresh, "password": "short"})
    assert short.status_code == 400 and "Use at least 12 characters" in short.text
    with app.app_context():
        emails = db.session.scalars(select(func.lower(Account.email))).all()
        assert emails.count(email) == 1 and fresh not in emails


def test_a_signed_up_account_keeps_only_an_argon2id_hash(app):
    client = new_client(app)
    email = new_email()
    signed_up = post_form(client, "/signup", "/signup", {"email": email, "password": PASSWORD})
    assert signed_up.status_code == 302 and client.get("/keys").status_code == 200
    with app.app_context():
        stored = db.session.scalar(select(Person.password_hash).where(Person.email == email))
    assert stored.startswith("$argon2id$") and PASSWORD not in stored


def test_closed_sign_up_creates_no_account(app, database_url):
    from app import create_app
    from tests.conftest import TEST_CATALOG

    closed = create_app(
        "testing",
        {
            "SQLALCHEMY_DATABASE_URI": database_url,
            "MODEL_CATALOG": TEST_CATALOG,
            "SIGNUP": "closed",
        },
    )
    client = closed.test_client()
    assert client.get("/signup").status_code == 403
    email = new_email()
    token = csrf_token(client.get("/signin").text)
    response = client.post(
        "/signup", data={"csrf_token": token, "email": email, "password": PASSWORD}
    )
    assert response.status_code == 403
    with app.app_context():
        assert db.session.scalar(select(Account).where(Account.email == email)) is None


def test_an_operator_grants_once_however_often_the_form_is_sent(app):
    admin_id, admin_email = make_holder(app)
    holder_id, holder_email = make_holder(app, credits=Decimal(0))
    with app.app_context():
        db.session.scalar(select(Person).where(Person.email == admin_email)).is_admin = True
        db.session.commit()
    client = new_client(app)
    sign_in(client, admin_email)
    page = client.get("/admin/accounts").text
    assert holder_email in page
    data = {
        "csrf_token": csrf_token(page),
        "amount": "7.5",
        "note": "welcome",
        "idempotency_key": "f" * 32,
    }
    for _ in range(2):
        assert client.post(f"/admin/accounts/{holder_id}/grant", data=data).status_code == 302
    with app.app_context():
        entries = db.session.scalars(
            select(LedgerEntry).where(LedgerEntry.account_id == holder_id)
        ).all()
        assert [(e.kind, e.amount) for e in entries] == [("grant", Decimal("7.5"))]
        assert entries[0].description == f"granted by {admin_email}: welcome"
        assert db.session.get(Account, holder_id).balance == Decimal("7.5")


def test_the_operators_page_is_not_there_for_holders(app, holder_client):
    client, account_id, _ = holder_client
    assert client.get("/admin/accounts").status_code == 404
    token = csrf_token(client.get("/keys").text)
    data = {"csrf_token": token, "amount": "100", "idempotency_key": "a" * 32}
    assert client.post(f"/admin/accounts/{account_id}/grant", data=data).status_code == 404
    with app.app_context():
        assert db.session.get(Account, account_id).balance == Decimal("5")


def test_a_key_name_like_a_formula_stays_text_in_the_csv(app, holder_client):
    client, account_id, email = holder_client
    with app.app_context():
        issued = create_key(account_id=account_id, name="=HYPERLINK(1)")
    record_generation(app, account_id, issued.id, "dev-chat", "0.01")
    row = client.get("/usage.csv").text.splitlines()[1]
    assert ",'=HYPERLINK(1)," in row


def test_the_ledger_lists_newest_first_fifty_a_page(app, holder_client):
    client, account_id, _ = holder_client
    with app.app_context():
        for number in range(1, 56):
            grant_credits(account_id=account_id, amount=Decimal("0.01"), description=f"g{number}")
    first = client.get("/balance").text
    assert first.index(">g55<") < first.index(">g54<") and ">g6<" in first and ">g5<" not in first
    assert 'rel="next" href="/balance?page=2"' in first and 'rel="prev"' not in first
    second = client.get("/balance?page=2").text
    assert ">g5<" in second and ">test<" in second and 'rel="next"' not in second


def test_operator_commands_find_a_signed_up_account_by_its_email(app, runner):
    client = new_client(app)
    email = new_email()
    post_form(client, "/signup", "/signup", {"email": email, "password": PASSWORD})
    granted = runner.invoke(args=["credits", "grant", email, "3"])
    assert granted.exit_code == 0 and "balance=$3" in granted.output
    assert "$3.00" in client.get("/balance").text


def test_usage_and_csv_say_which_api_a_generation_came_through_never_its_content(
    app, holder_client
):
    client, account_id, email = holder_client
    with app.app_context():
        issued = create_key(account_id=account_id, name="agents")
    marker = "quokka-content-5e2a"
    headers = {"Authorization": f"Bearer {issued.value}"}
    api = app.test_client()
    answered = api.post(
        "/v1/responses", json={"model": "dev-chat", "input": f"Hi {marker}"}, headers=headers
    )
    assert answered.status_code == 200 and marker in answered.text
    chat = {"model": "dev-chat", "messages": [{"role": "user", "content": "Hi"}]}
    assert api.post("/v1/chat/completions", json=chat, headers=headers).status_code == 200

    usage = client.get("/usage").text
    api = '<td data-label="API">{}</td>'.format
    assert api("responses") in usage and api("chat") in usage
    rows = client.get("/usage.csv").text.splitlines()
    assert sorted(row.split(",")[3] for row in rows[1:]) == ["chat", "responses"]
    assert answered.json["id"] in "\n".join(rows)
    for page in (usage, "\n".join(rows), client.get("/balance").text, client.get("/").text):
        assert marker not in page
