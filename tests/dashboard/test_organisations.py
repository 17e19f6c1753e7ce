"""Organisations over HTTP: invites, roles checked on every page and form, removal, switching.

Each person drives the dashboard with a client of their own, as in a browser; the API
is called with the keys they create.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select

from app.accounts.members import organisations_named
from app.accounts.models import Change, Membership, Person
from app.accounts.passwords import hash_password
from app.auth.keys import digest_key
from app.auth.models import ApiKey
from app.extensions import db
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

CHAT = {"model": "dev-chat", "messages": [{"role": "user", "content": "Hi"}]}


@dataclass
class Member:
    """A person signed in to the organisation, with their client."""

    client: FlaskClient
    email: str
    member_id: int = 0


def member_id_of(client: FlaskClient, email: str) -> int:
    """Return the id of ``email``'s membership of the organisation ``client`` works in."""
    with client.application.app_context():
        account_id = db.session.scalar(
            select(Membership.account_id)
            .join(Person, Person.id == Membership.person_id)
            .where(Person.email == client.signed_in_as)
            .order_by(Membership.id)
            .limit(1)
        )
        return db.session.scalar(
            select(Membership.id)
            .join(Person, Person.id == Membership.person_id)
            .where(Person.email == email, Membership.account_id == account_id)
        )


def invite(inviter: FlaskClient, email: str, role: str):
    """Invite ``email`` with ``role``; return the response."""
    return post_form(inviter, "/members", "/members", {"email": email, "role": role})


def person_in_no_organisation(app, email: str) -> None:
    """Make a person who signs in with PASSWORD and belongs nowhere (as one who left all)."""
    with app.app_context():
        db.session.add(Person(email=email, password_hash=hash_password(PASSWORD)))
        db.session.commit()


def join_from_link(app, link: str, email: str) -> FlaskClient:
    """Open an invite's link as ``email``: it sends them to sign in; they come back and join."""
    path = link.removeprefix("http://localhost")
    client = new_client(app)
    page = client.get(path).text
    assert 'name="password"' not in page, "an invite sets no password"
    sign_in_link = html.unescape(re.search(r'href="(/signin\?next=[^"]+)"', page).group(1))
    signed_in = post_form(
        client, sign_in_link, sign_in_link, {"email": email, "password": PASSWORD}
    )
    assert signed_in.status_code == 302 and signed_in.headers["Location"] == path
    assert post_form(client, path, path, {}).status_code == 302
    client.signed_in_as = email
    return client


def invited(app, inviter: FlaskClient, role: str) -> Member:
    """Invite a person, who signs in from the link and joins; return them signed in."""
    email = new_email()
    person_in_no_organisation(app, email)
    shown = invite(inviter, email, role)
    assert shown.status_code == 201, shown.text
    link = re.search(r'id="invite-link" value="([^"]+)"', shown.text).group(1)
    client = join_from_link(app, link, email)
    return Member(client, email, member_id_of(inviter, email))


def signed_in(app, email: str) -> FlaskClient:
    """A client signed in as ``email``, which remembers whom it is signed in as."""
    client = new_client(app)
    assert sign_in(client, email).status_code == 302
    client.signed_in_as = email
    return client


@pytest.fixture
def team(app):
    """An owner with $5, an admin and a member they invited."""
    _, owner_email = make_holder(app)
    owner = signed_in(app, owner_email)
    admin = invited(app, owner, "admin")
    member = invited(app, owner, "member")
    return Member(owner, owner_email), admin, member


def create_key(client: FlaskClient, name: str) -> tuple[int, str]:
    """Create a key from the keys page; return its id and value."""
    created = post_form(client, "/keys", "/keys", {"name": name})
    assert created.status_code == 201, created.text
    value = new_key_value(created.text)
    with client.application.app_context():
        key_id = db.session.scalar(select(ApiKey.id).where(ApiKey.digest == digest_key(value)))
    return key_id, value


def ask(app, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return app.test_client().post("/v1/chat/completions", json=CHAT, headers=headers).status_code


def test_a_member_sees_only_their_own_keys_and_usage(app, team):
    owner, admin, member = team
    owner_key = create_key(owner.client, "owner-key")
    member_key = create_key(member.client, "member-key")
    assert ask(app, owner_key[1]) == 200 and ask(app, member_key[1]) == 200

    keys_page = member.client.get("/keys").text
    assert "member-key" in keys_page and "owner-key" not in keys_page
    usage = member.client.get("/usage").text
    assert "member-key" in usage and "owner-key" not in usage and "Per member" not in usage
    csv = member.client.get("/usage.csv").text.splitlines()
    assert len(csv) == 2 and "member-key" in csv[1]
    # The member's export (its keys bound as a list) writes the row as the owner's does.
    assert csv[1] in owner.client.get(f"/usage.csv?key={member_key[0]}").text.splitlines()

    owner_usage = owner.client.get("/usage").text
    assert "Per member" in owner_usage
    assert owner.email in owner_usage and member.email in owner_usage
    assert "member-key" in admin.client.get("/keys").text


def test_roles_are_checked_on_every_page_and_form(app, team):
    owner, admin, member = team
    owner_key_id, _ = create_key(owner.client, "owner-key")
    for path in ("/members", "/changes"):
        assert member.client.get(path).status_code == 403, path
        assert admin.client.get(path).status_code == 200, path
    # A member sees the balance; the ledger, the payments and the forms are an admin's.
    members_balance = member.client.get("/balance")
    assert members_balance.status_code == 200 and 'id="balance"' in members_balance.text
    for admins_only in ("Ledger", "Payments", "Redeem</button>"):
        assert admins_only not in members_balance.text
        assert admins_only in admin.client.get("/balance").text
    token = csrf_token(member.client.get("/keys").text)
    forms = [
        ("/balance/credits", {"amount": "20"}),
        ("/balance/redeem", {"code": "gc_anything"}),
        ("/members", {"email": new_email(), "role": "member"}),
        (f"/members/{admin.member_id}/role", {"role": "member"}),
        (f"/members/{admin.member_id}/remove", {}),
        (f"/keys/{owner_key_id}/revoke", {}),
        (f"/keys/{owner_key_id}/delete", {}),
    ]
    for path, data in forms:
        refused = member.client.post(path, data={"csrf_token": token, **data})
        assert refused.status_code == 403, path
    assert member.client.get(f"/keys/{owner_key_id}/edit").status_code == 403

    # An admin manages members, but owners only an owner does.
    assert invite(admin.client, new_email(), "owner").status_code == 403
    owner_member_id = member_id_of(admin.client, owner.email)
    token = csrf_token(admin.client.get("/members").text)
    assert (
        admin.client.post(
            f"/members/{owner_member_id}/remove", data={"csrf_token": token}
        ).status_code
        == 403
    )
    assert (
        admin.client.post(
            f"/members/{member.member_id}/role", data={"csrf_token": token, "role": "owner"}
        ).status_code
        == 403
    )
    changed = admin.client.post(
        f"/members/{member.member_id}/role", data={"csrf_token": token, "role": "admin"}
    )
    assert changed.status_code == 302
    assert member.client.get("/members").status_code == 200, "the new role counts at once"


def test_another_organisations_objects_are_not_found(app, team):
    owner, _, _ = team
    stranger_account, stranger_email = make_holder(app)
    stranger = signed_in(app, stranger_email)
    foreign_key, _ = create_key(stranger, "foreign")
    foreign_member = member_id_of(stranger, stranger_email)
    token = csrf_token(owner.client.get("/members").text)
    assert owner.client.get(f"/keys/{foreign_key}/edit").status_code == 404
    for path in (
        f"/keys/{foreign_key}/revoke",
        f"/members/{foreign_member}/remove",
        f"/members/{foreign_member}/role",
        f"/organisations/{stranger_account}/switch",
    ):
        refused = owner.client.post(path, data={"csrf_token": token, "role": "member"})
        assert refused.status_code == 404, path
    assert "foreign" in stranger.get("/keys").text and "badge-active" in stranger.get("/keys").text


def test_forms_without_their_csrf_token_are_refused(app, team):
    owner, admin, _ = team
    assert owner.client.post("/members", data={"email": new_email()}).status_code == 400
    refused = owner.client.post(f"/members/{admin.member_id}/remove", data={})
    assert refused.status_code == 400
    assert "admin" in owner.client.get("/members").text


def test_a_removed_members_keys_stop_at_once_and_their_usage_stays(app, team):
    owner, admin, member = team
    key_id, value = create_key(member.client, "leaving")
    assert ask(app, value) == 200
    token = csrf_token(admin.client.get("/members").text)
    removed = admin.client.post(f"/members/{member.member_id}/remove", data={"csrf_token": token})
    assert removed.status_code == 302
    assert ask(app, value) == 403
    with app.app_context():
        assert db.session.get(ApiKey, key_id).state == "revoked"
    assert member.email in owner.client.get("/usage").text, "their usage stays attributed"
    assert member.email not in owner.client.get("/members").text
    assert member.client.get("/keys").status_code == 302, "they belong to no organisation now"


def test_the_last_owner_stays(app, team):
    owner, _, _ = team
    owner_member_id = member_id_of(owner.client, owner.email)
    token = csrf_token(owner.client.get("/members").text)
    for path, data in (
        (f"/members/{owner_member_id}/role", {"role": "admin"}),
        (f"/members/{owner_member_id}/remove", {}),
    ):
        refused = owner.client.post(path, data={"csrf_token": token, **data})
        assert refused.status_code == 302
        assert "at least one owner" in owner.client.get("/members").text
    assert owner.client.get("/balance").status_code == 200, "still the owner"


def test_a_person_switches_between_their_organisations(app, team):
    owner, admin, _ = team
    other_account, other_email = make_holder(app)
    other = signed_in(app, other_email)
    # The team's admin, who has a password, is invited to a second organisation.
    shown = invite(other, admin.email, "member")
    path = re.search(r'id="invite-link" value="([^"]+)"', shown.text).group(1)
    path = path.removeprefix("http://localhost")
    stranger = new_client(app)
    page = stranger.get(path).text
    assert "Sign in as" in page and 'name="password"' not in page, "the link checks no password"
    assert post_form(stranger, "/signin", path, {}).status_code == 403
    page = admin.client.get(path).text
    assert "Join" in page and "Set your password" not in page
    assert post_form(admin.client, path, path, {}).status_code == 302
    assert admin.client.get(path).status_code == 404, "the link works once"
    assert sign_in(new_client(app), admin.email).status_code == 302, "the password is unchanged"
    assert admin.client.get("/members").status_code == 403, "a member in the one just joined"

    listed = admin.client.get("/organisations").text
    assert owner.email in listed and other_email in listed
    token = csrf_token(listed)
    for account_id, members_page, name in (
        (_account_of(app, owner.email), 200, owner.email),
        (other_account, 403, other_email),
    ):
        switch = f"/organisations/{account_id}/switch"
        assert admin.client.post(switch, data={"csrf_token": token}).status_code == 302
        assert admin.client.get("/members").status_code == members_page
        keys_page = html.unescape(admin.client.get("/keys").text)
        assert f"balance of {name}'s organisation" in keys_page, "the session keeps it"


def _account_of(app, owner_email: str) -> int:
    with app.app_context():
        return db.session.scalar(
            select(Membership.account_id)
            .join(Person, Person.id == Membership.person_id)
            .where(Person.email == owner_email)
            .order_by(Membership.id)
            .limit(1)
        )


def test_the_audit_log_records_who_changed_what(app, team):
    owner, admin, member = team
    key_id, _ = create_key(member.client, "audited")
    token = csrf_token(admin.client.get("/members").text)
    admin.client.post(
        f"/members/{member.member_id}/role", data={"csrf_token": token, "role": "admin"}
    )
    admin.client.post(f"/keys/{key_id}/revoke", data={"csrf_token": token})
    page = owner.client.get("/changes").text
    for action in ("member.invite", "member.role", "key.create", "key.revoke"):
        assert action in page, action
    assert admin.email in page and member.email in page
    with app.app_context():
        actions = db.session.scalars(select(Change.action).order_by(Change.id)).all()
    assert "member.role" in actions


def test_an_invite_is_mailed_when_smtp_is_set(app, team, smtp_server, monkeypatch):
    owner, _, _ = team
    received, url = smtp_server
    monkeypatch.setitem(app.config, "SMTP_URL", url)
    email = new_email()
    person_in_no_organisation(app, email)
    sent = invite(owner.client, email, "member")
    assert sent.status_code == 302, "mailed: the link is not shown"
    assert "invite-link" not in owner.client.get("/members").text
    (message,) = received
    assert message["To"] == email and message["Subject"] == f"Join {owner.email}'s organisation"
    link = re.search(r"(http://localhost/invite/\S+)", message.get_payload()).group(1)
    client = join_from_link(app, link, email)
    assert client.get("/keys").status_code == 200


def test_an_invite_whose_mail_fails_shows_the_link(app, team, monkeypatch):
    owner, _, _ = team
    monkeypatch.setitem(app.config, "SMTP_URL", "smtp://127.0.0.1:9")  # nothing listens
    shown = invite(owner.client, new_email(), "member")
    assert shown.status_code == 201 and 'id="invite-link"' in shown.text
    assert "could not be e-mailed" in shown.text


def test_an_admin_creates_a_key_for_a_member_and_a_member_only_for_themselves(app, team):
    owner, admin, member = team
    keys_page = admin.client.get("/keys").text
    assert 'name="member"' in keys_page and member.email in keys_page
    assert 'name="member"' not in member.client.get("/keys").text

    data = {"name": "for-the-member", "member": str(member.member_id)}
    created = post_form(admin.client, "/keys", "/keys", data)
    assert created.status_code == 201, created.text
    value = new_key_value(created.text)
    assert ask(app, value) == 200
    assert "for-the-member" in member.client.get("/keys").text
    usage = member.client.get("/usage").text
    assert "for-the-member" in usage

    # A member's form has no such field: what they post for it is not read.
    data = {"name": "not-for-the-admin", "member": str(admin.member_id)}
    created = post_form(member.client, "/keys", "/keys", data)
    assert created.status_code == 201, created.text
    # A removed member, or another organisation's, is not among the choices.
    data = {"name": "for-nobody", "member": "999999999"}
    refused = post_form(admin.client, "/keys", "/keys", data)
    assert refused.status_code == 400 and "Not a valid choice" in refused.text
    with app.app_context():
        owners = dict(
            db.session.execute(
                select(ApiKey.name, ApiKey.member_id).where(
                    ApiKey.name.in_(["for-the-member", "not-for-the-admin", "for-nobody"])
                )
            ).all()
        )
    assert owners == {"for-the-member": member.member_id, "not-for-the-admin": member.member_id}


def test_an_organisation_is_not_made_under_a_name_taken_in_any_letter_case(app, team):
    owner, _, _ = team
    name = f"Team {new_email()[7:15]}"
    made = post_form(owner.client, "/organisations", "/organisations", {"name": name})
    assert made.status_code == 302
    for taken in (name, name.upper(), f"  {name.lower()} "):
        refused = post_form(owner.client, "/organisations", "/organisations", {"name": taken})
        assert refused.status_code == 400, taken
        assert "That name is taken: choose another." in refused.text
        assert 'aria-invalid="true"' in refused.text, "the field is marked for forms.js to focus"
    address = post_form(
        owner.client, "/organisations", "/organisations", {"name": owner.email.upper()}
    )
    assert address.status_code == 400
    assert "must not be an e-mail address" in address.text
    with app.app_context():
        assert len(organisations_named(name)) == 1
        assert len(organisations_named(owner.email)) == 1


def test_the_header_names_the_person_and_the_organisation_once_each(app, team):
    owner, admin, _ = team
    header = re.search(r"<header.*?</header>", owner.client.get("/keys").text, re.S).group(0)
    assert header.count(owner.email) == 1
    assert "your personal organisation (owner)" in html.unescape(header)
    header = re.search(r"<header.*?</header>", admin.client.get("/keys").text, re.S).group(0)
    assert f"{owner.email}'s organisation (admin)" in html.unescape(header)
    assert header.count(admin.email) == 1
