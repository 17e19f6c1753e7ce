"""Ways into the dashboard, tried from outside over real HTTP against gunicorn.

Nobody reaches an organisation or a sign-in that is not theirs: an organisation's invite
never sets a password (whoever it is for), a redirect after sign-in stays on this site,
an invite dies with its inviter's role and can be revoked, sign-up does not tell a known
address from a new one, and a webhook URL's password is never shown.

Each visitor is a requests session of its own, from an address of its own (the server
trusts one proxy hop), so the sign-in limits per address stay apart.
"""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal

import pytest
import requests
from sqlalchemy import select

from app.accounts.models import Change, Membership, Person
from app.alerts.delivery import deliver_alerts
from app.alerts.endpoints import set_balance_threshold
from app.alerts.models import AlertEndpoint
from app.auth.models import ApiKey
from app.extensions import db
from tests.alert_receiver import webhook_receiver
from tests.conftest import running_server, running_smtp_server
from tests.dashboard.conftest import PASSWORD, csrf_token, make_holder, new_email

OTHER_PASSWORD = "an attacker's chosen password"


@dataclass
class Visitor:
    """A browser: its own cookies, its own client address."""

    base: str
    http: requests.Session = field(default_factory=requests.Session)

    def __post_init__(self) -> None:
        self.http.headers["X-Forwarded-For"] = (
            f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.7"
        )

    def get(self, path: str) -> requests.Response:
        return self.http.get(self.base + path, allow_redirects=False, timeout=30)

    def post(self, path: str, data: dict, page: str | None = None) -> requests.Response:
        """Post ``data`` with the CSRF token of the form on ``page`` (``path`` by default)."""
        token = csrf_token(self.get(page or path).text)
        return self.http.post(
            self.base + path, data={"csrf_token": token, **data}, allow_redirects=False, timeout=30
        )

    def sign_in(self, email: str, password: str = PASSWORD, query: str = "") -> requests.Response:
        return self.post(f"/signin{query}", {"email": email, "password": password}, "/signin")


@pytest.fixture(scope="module")
def server(app, database_url: str, tmp_path_factory) -> Iterator[str]:
    """The service without mail, behind one trusted proxy hop."""
    with running_server(database_url, tmp_path_factory.mktemp("access"), PROXY_HOPS="1") as live:
        yield live.url


@dataclass
class MailedServer:
    url: str
    inbox: list


@pytest.fixture(scope="module")
def mailed(app, database_url: str, tmp_path_factory) -> Iterator[MailedServer]:
    """The service with SMTP_URL set to a real SMTP server here, and a PUBLIC_URL."""
    with running_smtp_server() as (inbox, smtp_url):
        with running_server(
            database_url,
            tmp_path_factory.mktemp("access-mail"),
            PROXY_HOPS="1",
            SMTP_URL=smtp_url,
            PUBLIC_URL="https://gateway.example",
        ) as live:
            yield MailedServer(live.url, inbox)


def password_hash(app, email: str) -> str | None:
    with app.app_context():
        return db.session.scalar(select(Person.password_hash).where(Person.email == email))


def run(runner, *args: str) -> str:
    result = runner.invoke(args=list(args))
    assert result.exit_code == 0, result.output
    return result.output


def invite_link(inviter: Visitor, email: str, role: str = "member") -> str:
    """Invite ``email`` from the members page; return the link's path, shown without mail."""
    shown = inviter.post("/members", {"email": email, "role": role})
    assert shown.status_code == 201, shown.text
    link = re.search(r'id="invite-link" value="([^"]+)"', shown.text).group(1)
    return "/" + link.split("/", 3)[3]


def signed_in_holder(app, base: str) -> tuple[Visitor, str]:
    """A person who signed up (owner of their own organisation), signed in."""
    _, email = make_holder(app)
    visitor = Visitor(base)
    assert visitor.sign_in(email).status_code == 302
    return visitor, email


def try_takeover(app, server: str, victim: str) -> None:
    """An owner of another organisation invites ``victim`` and tries every way to set a password."""
    attacker, _ = signed_in_holder(app, server)
    path = invite_link(attacker, victim, "admin")
    page = attacker.get(path)
    assert page.status_code == 403 and 'name="password"' not in page.text
    assert attacker.post(path, {"password": OTHER_PASSWORD}, page="/members").status_code == 403
    stranger = Visitor(server)
    page = stranger.get(path)
    assert page.status_code == 200 and 'name="password"' not in page.text
    assert f"Sign in as {victim}" in page.text
    assert stranger.post(path, {"password": OTHER_PASSWORD}, page="/signin").status_code == 403
    signed_up = stranger.post(
        f"/signup?email={victim}", {"email": victim, "password": OTHER_PASSWORD}
    )
    assert signed_up.status_code == 400 and "cannot be signed up here" in signed_up.text
    assert password_hash(app, victim) is None
    assert Visitor(server).sign_in(victim, OTHER_PASSWORD).status_code == 401


def test_an_invite_cannot_take_over_an_owner_the_operator_made_without_a_password(
    app, runner, server
):
    victim = new_email()
    run(runner, "orgs", "create", f"Victim {uuid.uuid4().hex[:6]}", "--owner", victim)
    try_takeover(app, server, victim)


def test_an_invite_cannot_take_over_an_operator_made_without_a_password(app, runner, server):
    victim = new_email()
    run(runner, "accounts", "create", victim, "--admin")
    try_takeover(app, server, victim)
    assert Visitor(server).get("/admin/accounts").status_code != 200


def test_an_invite_cannot_take_over_a_person_mid_invite_whose_own_link_still_works(
    app, runner, server
):
    victim = new_email()
    own_link = run(runner, "accounts", "invite", victim, "--base-url", server).splitlines()[-1]
    try_takeover(app, server, victim)
    visitor = Visitor(server)
    path = own_link.removeprefix(server)
    assert visitor.post(path, {"password": PASSWORD}).status_code == 302
    assert visitor.get("/keys").status_code == 200
    assert Visitor(server).sign_in(victim).status_code == 302


def test_the_operators_invite_still_lets_someone_without_a_password_set_one(app, runner, server):
    owner = new_email()
    name = f"Ops {uuid.uuid4().hex[:6]}"
    run(runner, "orgs", "create", name, "--owner", owner)
    newcomer = new_email()
    link = run(runner, "orgs", "invite", name, newcomer, "--base-url", server).splitlines()[-1]
    visitor = Visitor(server)
    path = link.removeprefix(server)
    assert 'name="password"' in visitor.get(path).text
    assert visitor.post(path, {"password": PASSWORD}).status_code == 302
    assert name in visitor.get("/organisations").text
    with app.app_context():
        assert db.session.scalar(select(Person.id).where(Person.email == newcomer)) is not None


def test_inviting_an_unknown_address_makes_nobody(app, server):
    owner, _ = signed_in_holder(app, server)
    email = new_email()
    invite_link(owner, email)
    with app.app_context():
        assert db.session.scalar(select(Person.id).where(Person.email == email)) is None


def test_an_invite_is_joined_only_by_the_address_it_was_sent_to(app, server):
    owner, _ = signed_in_holder(app, server)
    other, _ = signed_in_holder(app, server)
    invitee, invitee_email = signed_in_holder(app, server)
    path = invite_link(owner, invitee_email)
    refused = other.post(path, {}, page="/organisations")
    assert refused.status_code == 403 and f"This invite is for {invitee_email}" in refused.text
    assert invitee.post(path, {}).status_code == 302
    assert invitee.get("/members").status_code == 403, "joined as a member"


def test_signing_up_from_an_invite_comes_back_to_it(app, server):
    owner, _ = signed_in_holder(app, server)
    email = new_email()
    path = invite_link(owner, email)
    visitor = Visitor(server)
    sign_up = html.unescape(re.search(r'href="(/signup\?[^"]+)"', visitor.get(path).text)[1])
    assert f'value="{email}"' in visitor.get(sign_up).text
    signed_up = visitor.post(sign_up, {"email": email, "password": PASSWORD})
    assert signed_up.status_code == 302 and signed_up.headers["Location"] == path
    assert visitor.post(path, {}).status_code == 302


# Each as it goes on the wire, in the query string of the sign-in form's URL.
FOREIGN_TARGETS = [
    "/%09/evil.example/x",
    "%09/evil.example/x",
    "/%0A/evil.example",
    "/%0D%0A/evil.example",
    "/%0D%0ALocation:%20https://evil.example",
    "//evil.example",
    "///evil.example",
    "/%2F/evil.example",
    "%2F%2Fevil.example",
    "%252F%252Fevil.example",
    "/%252F/evil.example",
    "/%25252F/evil.example",
    "/%5Cevil.example",
    "%5C%5Cevil.example",
    "/%5C/evil.example",
    "/x/%5C..%5C..%5Cevil",
    "https://evil.example",
    "https:%2F%2Fevil.example",
    "http:/evil.example",
    "javascript:alert(1)",
    "JaVaScRiPt%3Aalert(1)",
    "/%20/evil.example",
    "%20//evil.example",
    "/%EF%BC%8F/evil.example",
    "/%E2%88%95evil.example",
    "/%E2%81%84evil.example",
    "/%C0%AFevil.example",
    "/%00/evil.example",
    "evil.example",
    "",
]


@pytest.mark.parametrize("target", FOREIGN_TARGETS)
def test_sign_in_goes_home_rather_than_to_any_foreign_target(app, server, target):
    _, email = make_holder(app)
    signed_in = Visitor(server).sign_in(email, query=f"?next={target}")
    assert signed_in.status_code == 302
    assert signed_in.headers["Location"] == "/keys", target


@pytest.mark.parametrize(
    ("target", "location"),
    [("/usage%3Ffrom%3D2026-01-01", "/usage?from=2026-01-01"), ("/members", "/members")],
)
def test_sign_in_follows_a_path_on_this_site(app, server, target, location):
    _, email = make_holder(app)
    signed_in = Visitor(server).sign_in(email, query=f"?next={target}")
    assert signed_in.headers["Location"] == location


def test_sign_up_follows_only_a_path_on_this_site_too(server):
    visitor = Visitor(server)
    query = "?next=/%09/evil.example"
    signed_up = visitor.post(f"/signup{query}", {"email": new_email(), "password": PASSWORD})
    assert signed_up.headers["Location"] == "/keys"


def team_with_admin(app, server: str) -> tuple[Visitor, Visitor, str]:
    """An owner, and an admin they invited who joined: (owner, admin, admin's email)."""
    owner, _ = signed_in_holder(app, server)
    admin, admin_email = signed_in_holder(app, server)
    assert admin.post(invite_link(owner, admin_email, "admin"), {}).status_code == 302
    return owner, admin, admin_email


def member_id(owner: Visitor, email: str) -> int:
    """Return the id of ``email``'s membership, from the owner's members page."""
    page = owner.get("/members").text
    return int(re.search(rf'for="role-(\d+)">Role of {re.escape(email)}<', page)[1])


def pending_invites(owner: Visitor) -> str:
    """Return the pending invites' part of the members page ("" when there are none)."""
    page = owner.get("/members").text
    found = re.search(r'<section[^>]*aria-labelledby="invites-heading".*?</section>', page, re.S)
    return found[0] if found else ""


@pytest.mark.parametrize("change", ["removed", "demoted"])
def test_an_invite_dies_when_its_inviter_is_removed_or_demoted(app, server, change):
    owner, admin, admin_email = team_with_admin(app, server)
    joiner, joiner_email = signed_in_holder(app, server)
    path = invite_link(admin, joiner_email)
    assert joiner_email in pending_invites(owner)
    admin_member = member_id(owner, admin_email)
    if change == "removed":
        assert owner.post(f"/members/{admin_member}/remove", {}, "/members").status_code == 302
    else:
        demoted = owner.post(f"/members/{admin_member}/role", {"role": "member"}, "/members")
        assert demoted.status_code == 302
    assert joiner.get(path).status_code == 404
    assert joiner.post(path, {}, page="/organisations").status_code == 404
    assert joiner_email not in pending_invites(owner)


def test_pending_invites_are_listed_with_their_inviter_and_revoked(app, server):
    owner, admin, admin_email = team_with_admin(app, server)
    joiner, joiner_email = signed_in_holder(app, server)
    path = invite_link(admin, joiner_email)
    pending = pending_invites(owner)
    assert joiner_email in pending and admin_email in pending and ">member<" in pending
    invite_id = re.search(r'action="/members/invites/(\d+)/revoke"', pending)[1]
    member = Visitor(server)
    assert member.post(f"/members/invites/{invite_id}/revoke", {}, "/signin").status_code == 302
    assert joiner_email in pending_invites(owner), "a stranger revokes nothing"
    no_token = owner.http.post(
        f"{server}/members/invites/{invite_id}/revoke", allow_redirects=False, timeout=30
    )
    assert no_token.status_code == 400
    revoked = owner.post(f"/members/invites/{invite_id}/revoke", {}, "/members")
    assert revoked.status_code == 302
    assert joiner.get(path).status_code == 404
    assert joiner_email not in pending_invites(owner)
    assert "member.invite.revoke" in owner.get("/changes").text


def test_without_mail_sign_up_refuses_a_known_address_and_never_sets_its_password(
    app, runner, server
):
    passwordless = new_email()
    run(runner, "accounts", "create", passwordless)
    _, known = make_holder(app)
    before = password_hash(app, known)
    for email in (passwordless, known):
        refused = Visitor(server).post("/signup", {"email": email, "password": OTHER_PASSWORD})
        assert refused.status_code == 400 and "cannot be signed up here" in refused.text
        assert "already exists" not in refused.text
    assert password_hash(app, passwordless) is None and password_hash(app, known) == before


def test_sign_up_is_limited_like_sign_in(app, server):
    _, known = make_holder(app)
    statuses = [
        Visitor(server).post("/signup", {"email": known, "password": "short"}).status_code
        for _ in range(6)
    ]
    assert statuses == [400] * 5 + [429]
    visitor = Visitor(server)
    many = [
        visitor.post("/signup", {"email": new_email(), "password": "short"}).status_code
        for _ in range(21)
    ]
    assert many == [400] * 20 + [429]


def sent_page(response: requests.Response, email: str) -> str:
    """The page's text with the address and the per-request CSRF token taken out."""
    text = response.text.replace(email, "ADDRESS")
    return re.sub(r'value="[^"]{40,}"', "TOKEN", text)


def mailed_link(inbox: list, email: str, public: str = "https://gateway.example") -> str:
    """Return the path of the link in the last message to ``email``, checking its address."""
    message = [m for m in inbox if m["To"] == email][-1]
    link = re.search(r"(https?://\S+)", message.get_payload(decode=True).decode())[1]
    assert link.startswith(public + "/"), link
    return link.removeprefix(public)


def test_with_mail_sign_up_answers_alike_and_mails_what_differs(app, runner, mailed):
    _, known = make_holder(app)
    known_hash = password_hash(app, known)
    fresh = new_email()
    answers = {
        email: Visitor(mailed.url).post("/signup", {"email": email, "password": OTHER_PASSWORD})
        for email in (known, fresh)
    }
    assert answers[known].status_code == answers[fresh].status_code == 200
    assert sent_page(answers[known], known) == sent_page(answers[fresh], fresh)
    assert password_hash(app, known) == known_hash
    with app.app_context():
        assert db.session.scalar(select(Person.id).where(Person.email == fresh)) is None

    reset = mailed_link(mailed.inbox, known)
    assert reset.startswith("/password/")
    confirm = mailed_link(mailed.inbox, fresh)
    assert confirm.startswith("/signup/confirm/")
    visitor = Visitor(mailed.url)
    assert fresh in visitor.get(confirm).text
    assert visitor.post(confirm, {}).status_code == 302
    assert visitor.get("/keys").status_code == 200
    assert Visitor(mailed.url).sign_in(fresh, OTHER_PASSWORD).status_code == 302
    assert visitor.post(confirm, {}, page="/keys").status_code == 404, "once"


def test_a_passwordless_owner_gets_a_reset_mailed_to_them_not_to_whoever_signs_up(
    app, runner, mailed
):
    owner = new_email()
    run(runner, "orgs", "create", f"Mailed {uuid.uuid4().hex[:6]}", "--owner", owner)
    attempt = Visitor(mailed.url).post("/signup", {"email": owner, "password": OTHER_PASSWORD})
    assert attempt.status_code == 200 and password_hash(app, owner) is None
    path = mailed_link(mailed.inbox, owner)
    visitor = Visitor(mailed.url)
    assert visitor.post(path, {"password": PASSWORD}).status_code == 302
    assert Visitor(mailed.url).sign_in(owner).status_code == 302
    assert Visitor(mailed.url).sign_in(owner, OTHER_PASSWORD).status_code == 401


def test_forgot_password_answers_alike_and_mails_only_a_known_address(app, mailed):
    _, known = make_holder(app)
    unknown = new_email()
    answers = [
        Visitor(mailed.url).post("/password/forgot", {"email": email}) for email in (known, unknown)
    ]
    assert [a.status_code for a in answers] == [200, 200]
    assert sent_page(answers[0], known) == sent_page(answers[1], unknown)
    assert [m for m in mailed.inbox if m["To"] == unknown] == []
    path = mailed_link(mailed.inbox, known)
    visitor = Visitor(mailed.url)
    assert visitor.post(path, {"password": OTHER_PASSWORD}).status_code == 302
    assert Visitor(mailed.url).sign_in(known, OTHER_PASSWORD).status_code == 302
    assert Visitor(mailed.url).get(path).status_code == 404, "once"
    limited = [
        Visitor(mailed.url).post("/password/forgot", {"email": known}).status_code for _ in range(5)
    ]
    assert limited[-1] == 429


def test_without_mail_there_is_no_forgot_password_page(server):
    assert Visitor(server).get("/password/forgot").status_code == 404


def test_production_without_mail_closes_sign_up_and_says_why(database_url):
    from app import create_app
    from tests.conftest import TEST_CATALOG

    production = create_app(
        "production",
        {
            "SQLALCHEMY_DATABASE_URI": database_url,
            "MODEL_CATALOG": TEST_CATALOG,
            "SECRET_KEY": "x" * 32,
            "SIGNUP": "open",
        },
    )
    page = production.test_client().get("/signup")
    assert page.status_code == 403 and "SMTP_URL is not set" in page.text


def test_the_password_link_command(app, runner, server):
    email = new_email()
    run(runner, "accounts", "create", email)
    result = runner.invoke(args=["accounts", "password-link", email, "--base-url", server])
    assert result.exit_code == 0 and result.stderr == ""
    path = result.stdout.splitlines()[-1].removeprefix(server)
    assert path.startswith("/password/")
    visitor = Visitor(server)
    assert visitor.post(path, {"password": PASSWORD}).status_code == 302
    assert Visitor(server).sign_in(email).status_code == 302

    unknown = runner.invoke(args=["accounts", "password-link", new_email()])
    assert unknown.exit_code == 1 and unknown.stdout == ""
    (line,) = unknown.stderr.strip().splitlines()
    assert line.startswith("Error: no person with email")


def test_a_new_password_ends_the_sessions_opened_with_the_old_one(app, runner, server):
    """Whoever holds a session from before the reset (a thief, say) is signed out by it."""
    earlier, email = signed_in_holder(app, server)
    assert earlier.get("/keys").status_code == 200
    link = run(runner, "accounts", "password-link", email, "--base-url", server)
    path = link.splitlines()[-1].removeprefix(server)
    resetter = Visitor(server)
    assert resetter.post(path, {"password": OTHER_PASSWORD}).status_code == 302

    signed_out = earlier.get("/keys")
    assert signed_out.status_code == 302 and "/signin" in signed_out.headers["Location"]
    assert resetter.get("/keys").status_code == 200
    later = Visitor(server)
    assert later.sign_in(email, OTHER_PASSWORD).status_code == 302
    assert later.get("/keys").status_code == 200


def test_a_link_uses_public_url_when_set(runner, monkeypatch):
    email = new_email()
    run(runner, "accounts", "create", email)
    monkeypatch.setenv("PUBLIC_URL", "https://gw.example/")
    link = run(runner, "accounts", "password-link", email).splitlines()[-1]
    assert link.startswith("https://gw.example/password/")


def test_a_webhook_urls_password_is_never_shown_but_sent_as_basic_auth(app, runner, server):
    owner, _ = signed_in_holder(app, server)
    with webhook_receiver() as receiver:
        url = receiver.url.replace("http://", "http://hook-user:pa55-w0rd@")
        added = owner.post("/alerts/endpoints", {"target": url}, "/alerts")
        assert added.status_code == 201
        receiver.secret = re.search(r"(whsec_[0-9a-f]+)", added.text)[1]
        pages = [added.text, owner.get("/alerts").text, owner.get("/changes").text]
        with app.app_context():
            endpoint = db.session.scalars(
                select(AlertEndpoint).order_by(AlertEndpoint.id.desc()).limit(1)
            ).one()
            organisation = endpoint.account_id
            stored = [endpoint.target, endpoint.sealed_userinfo]
            stored += map(str, db.session.scalars(select(Change.detail)).all())
            set_balance_threshold(organisation, Decimal("10"))  # above the $5: alerts at once
            deliver_alerts()
        listed = run(runner, "alerts", "webhook", "list", str(organisation))
        log = run(runner, "alerts", "log", str(organisation))
    for shown in [*pages, listed, log, *stored]:
        assert "pa55-w0rd" not in shown and "hook-user" not in shown
    assert "http://***@127.0.0.1" in pages[1] and "http://***@127.0.0.1" in listed
    assert receiver.events and receiver.bad_signatures == 0
    assert set(receiver.authorizations) == {"Basic aG9vay11c2VyOnBhNTUtdzByZA=="}


def key_id_named(app, name: str) -> int:
    with app.app_context():
        return db.session.scalar(select(ApiKey.id).where(ApiKey.name == name))


def test_an_admin_cannot_touch_an_owners_keys(app, server):
    owner, admin, admin_email = team_with_admin(app, server)
    name = f"owner key {uuid.uuid4().hex[:6]}"
    assert owner.post("/keys", {"name": name}).status_code == 201
    key_id = key_id_named(app, name)
    keys_page = admin.get("/keys").text
    assert name in keys_page and f"/keys/{key_id}/rotate" not in keys_page
    for action in ("rotate", "revoke", "delete"):
        assert admin.post(f"/keys/{key_id}/{action}", {}, "/keys").status_code == 403, action
    assert admin.get(f"/keys/{key_id}/edit").status_code == 403
    # The owner's own membership is the first (and chosen) of their form's members.
    owner_id = int(
        re.search(r'name="member"[^>]*>\s*<option[^>]*value="(\d+)"', owner.get("/keys").text)[1]
    )
    assert owner_id != member_id(owner, admin_email)
    for_owner = admin.post("/keys", {"name": "for the owner", "member": owner_id})
    assert for_owner.status_code == 400
    with app.app_context():
        assert db.session.get(ApiKey, key_id).state == "active"
        assert db.session.scalar(select(ApiKey.id).where(ApiKey.name == "for the owner")) is None


def test_an_admin_cannot_lift_their_own_budget_nor_set_an_owners(app, server):
    owner, admin, admin_email = team_with_admin(app, server)
    admin_id = member_id(owner, admin_email)
    budget = {"amount": "1", "window": "day"}
    assert owner.post(f"/members/{admin_id}/budget", budget, "/members").status_code == 302
    lifted = admin.post(f"/members/{admin_id}/budget", {"amount": "", "window": "day"}, "/members")
    assert lifted.status_code == 403
    owner_id = next(
        int(found)
        for found in re.findall(r'for="budget-(\d+)"', owner.get("/members").text)
        if int(found) != admin_id
    )
    assert admin.post(f"/members/{owner_id}/budget", budget, "/members").status_code == 403
    with app.app_context():
        assert db.session.get(Membership, admin_id).budget is not None
        assert db.session.get(Membership, owner_id).budget is None
