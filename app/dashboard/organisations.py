"""The dashboard's organisation pages: members, invites, roles, switching, the audit log.

Each view parses the form, calls the membership rules of ``app.accounts.members`` (which
check the role again, whatever the page showed), and renders.
"""

from __future__ import annotations

import smtplib

from flask import abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required
from werkzeug.wrappers import Response as BaseResponse

from app.accounts import members
from app.accounts.budgets import set_member_budget
from app.accounts.changes import recent_changes
from app.accounts.errors import (
    AlreadyMember,
    LastOwner,
    MemberNotFound,
    NotAllowed,
    OrganisationNameRefused,
)
from app.accounts.invites import mail_invite, pending_invites
from app.accounts.models import ADMIN, OWNER
from app.accounts.organisations import memberships_of, organisation_label
from app.budgets import budget_state
from app.dashboard.addresses import public_link
from app.dashboard.forms import BudgetForm, InviteForm, OrganisationForm, RoleForm
from app.dashboard.security import current_actor, role_required
from app.dashboard.session import switch_organisation
from app.dashboard.views import bp
from app.database import utcnow
from app.mail import mail_configured


def _members_page(form: InviteForm, status: int = 200, link: str | None = None):
    rows = members.list_members(current_user.account_id)
    page = render_template(
        "dashboard/members.html",
        rows=rows,
        form=form,
        role_form=RoleForm,
        budget_form=BudgetForm,
        budgets={row.membership.id: budget_state(row.membership, utcnow()) for row in rows},
        budget_rights={
            row.membership.id
            for row in rows
            if members.may_set_budget_of(current_actor(), row.membership)
        },
        link=link,
        may_make_owners=current_user.role == OWNER,
        invites=pending_invites(current_user.account_id),
    )
    return page, status


@bp.get("/members")
@role_required(ADMIN)
def list_members() -> tuple[str, int]:
    """List the organisation's members, with the form to invite one."""
    return _members_page(InviteForm())


@bp.post("/members")
@role_required(ADMIN)
def invite_member() -> tuple[str, int] | BaseResponse:
    """Invite a person by a one-time link: e-mailed if mail is set up, else shown once."""
    form = InviteForm()
    if not form.validate():
        return _members_page(form, 400)
    email = form.email.data.strip()
    try:
        token = members.invite_member(
            current_user.account_id, current_actor(), email=email, role=form.role.data
        )
    except NotAllowed:
        abort(403)
    except AlreadyMember as error:
        form.email.errors.append(str(error))
        return _members_page(form, 400)
    link = public_link("dashboard.accept_invite_page", token=token)
    if mail_configured() and _mailed(email, link):
        flash(f"Sent an invite to {email}.", "success")
        return redirect(url_for(".list_members"))
    return _members_page(InviteForm(formdata=None), 201, link=link)


def _mailed(email: str, link: str) -> bool:
    """Mail the invite's link; False (and the link is shown instead) if the server failed."""
    try:
        mail_invite(
            email=email,
            organisation=organisation_label(
                current_user.organisation_name, current_user.organisation_personal_of, None
            ),
            inviter=current_user.email,
            link=link,
        )
    except (smtplib.SMTPException, OSError) as error:
        current_app.logger.warning("invite mail not sent: %s", type(error).__name__)
        flash("The invite could not be e-mailed: give the link below yourself.", "error")
        return False
    return True


@bp.post("/members/invites/<int:invite_id>/revoke")
@role_required(ADMIN)
def revoke_invite(invite_id: int) -> BaseResponse:
    """Revoke a pending invite: its link stops working at once."""
    try:
        invite = members.revoke_invite(current_user.account_id, current_actor(), invite_id)
    except MemberNotFound:
        abort(404)
    except NotAllowed:
        abort(403)
    flash(f"Revoked the invite of {invite.email}.", "success")
    return redirect(url_for(".list_members"))


@bp.post("/members/<int:member_id>/role")
@role_required(ADMIN)
def change_role(member_id: int) -> BaseResponse:
    """Change a member's role; only an owner makes or unmakes an owner."""
    form = RoleForm()
    if not form.validate():
        abort(400)
    try:
        member = members.change_role(
            current_user.account_id, current_actor(), member_id, form.role.data
        )
    except MemberNotFound:
        abort(404)
    except NotAllowed:
        abort(403)
    except LastOwner as error:
        flash(str(error), "error")
        return redirect(url_for(".list_members"))
    flash(f"Changed the role to {member.role}.", "success")
    return redirect(url_for(".list_members"))


@bp.post("/members/<int:member_id>/budget")
@role_required(ADMIN)
def set_budget(member_id: int) -> BaseResponse:
    """Set or clear a member's budget: an amount in USD a window, for all their keys."""
    form = BudgetForm()
    if not form.validate():
        flash(" ".join(error for errors in form.errors.values() for error in errors), "error")
        return redirect(url_for(".list_members"))
    try:
        member = members.find_member(current_user.account_id, member_id)
    except MemberNotFound:
        abort(404)
    if not members.may_set_budget_of(current_actor(), member):
        abort(403)
    set_member_budget(
        member.id,
        amount=form.amount.amount,
        window=form.window.data,
        actor=current_user.person_id,
    )
    flash("Saved the budget.", "success")
    return redirect(url_for(".list_members"))


@bp.post("/members/<int:member_id>/remove")
@role_required()
def remove_member(member_id: int) -> BaseResponse:
    """Remove a member (or leave): their keys are revoked at once, their usage stays."""
    try:
        revoked = members.remove_member(current_user.account_id, current_actor(), member_id)
    except MemberNotFound:
        abort(404)
    except NotAllowed:
        abort(403)
    except LastOwner as error:
        flash(str(error), "error")
        return redirect(url_for(".list_members"))
    flash(f"Removed the member; {revoked} of their keys revoked.", "success")
    if member_id == current_user.member_id:
        return redirect(url_for(".organisations"))
    return redirect(url_for(".list_members"))


@bp.get("/organisations")
@login_required
def organisations() -> str:
    """List the person's organisations, to switch between, with the form to make one."""
    return _organisations_page(OrganisationForm())


def _organisations_page(form: OrganisationForm) -> str:
    return render_template(
        "dashboard/organisations.html",
        memberships=memberships_of(current_user.person_id),
        form=form,
    )


@bp.post("/organisations")
@login_required
def create_organisation() -> BaseResponse | tuple[str, int]:
    """Make an organisation the person owns, and switch to it."""
    form = OrganisationForm()
    if not form.validate():
        return _organisations_page(form), 400
    try:
        account = members.create_organisation(
            name=form.name.data, owner_email=current_user.email, actor=current_user.person_id
        )
    except OrganisationNameRefused as error:
        # Another organisation's id is the operator's to see, not a stranger's.
        taken = "That name is taken: choose another." if error.taken_id else str(error)
        form.name.errors.append(taken)
        return _organisations_page(form), 400
    switch_organisation(current_user.person_id, account.id)
    flash(f"Created {account.name}.", "success")
    return redirect(url_for(".list_keys"))


@bp.post("/organisations/<int:account_id>/switch")
@login_required
def switch(account_id: int) -> BaseResponse:
    """Work in another of the person's organisations from now on (kept in the session)."""
    account = switch_organisation(current_user.person_id, account_id)
    if account is None:
        abort(404)
    flash(f"Switched to {account.name}.", "success")
    return redirect(url_for(".list_keys"))


@bp.get("/changes")
@role_required(ADMIN)
def changes() -> str:
    """Show the organisation's audit log: who changed what, and when."""
    limit = request.args.get("limit", 200, type=int)
    rows = recent_changes(current_user.account_id, max(1, min(limit, 1000)))
    return render_template("dashboard/changes.html", rows=rows)
