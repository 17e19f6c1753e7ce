"""The dashboard's forms: what each accepts, with the field errors a holder sees."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from flask_wtf import FlaskForm
from wtforms import (
    EmailField,
    HiddenField,
    PasswordField,
    SelectField,
    SelectMultipleField,
    StringField,
)
from wtforms.validators import DataRequired, Length, Optional, Regexp, ValidationError

from app.accounts.budgets import checked_budget_amount
from app.accounts.errors import InvalidKeyLimits
from app.accounts.keys import checked_permitted_models
from app.accounts.models import ROLES
from app.accounts.passwords import MAX_PASSWORD_LENGTH, MIN_PASSWORD_LENGTH
from app.budgets import DAY, FIVE_HOURS, MONTH, WEEK

MAX_USD = Decimal("1000000")
PASSWORD_LENGTH = Length(
    min=MIN_PASSWORD_LENGTH,
    max=MAX_PASSWORD_LENGTH,
    message=f"Use at least {MIN_PASSWORD_LENGTH} characters (and at most {MAX_PASSWORD_LENGTH}).",
)


class SignInForm(FlaskForm):
    """Email and password."""

    email = EmailField("Email", validators=[DataRequired(), Length(max=320)])
    password = PasswordField("Password", validators=[DataRequired()])


class SignUpForm(FlaskForm):
    """A new account's email and password."""

    email = EmailField(
        "Email",
        validators=[
            DataRequired(),
            Regexp(r"^[^@\s]+@[^@\s]+\.[^@\s]+$", message="Enter an email address."),
            Length(max=320),
        ],
    )
    password = PasswordField(
        "Password",
        validators=[DataRequired(), PASSWORD_LENGTH],
        description=f"At least {MIN_PASSWORD_LENGTH} characters.",
    )


class ForgotPasswordForm(FlaskForm):
    """The address to mail a password link to."""

    email = EmailField("Email", validators=[DataRequired(), Length(max=320)])


class SetPasswordForm(FlaskForm):
    """The password an invited holder chooses."""

    password = PasswordField(
        "Password",
        validators=[DataRequired(), PASSWORD_LENGTH],
        description=f"At least {MIN_PASSWORD_LENGTH} characters.",
    )


WINDOW_CHOICES = [
    (MONTH, "per month"),
    (WEEK, "per week"),
    (DAY, "per day"),
    (FIVE_HOURS, "per 5 hours"),
]
WINDOW_HELP = (
    "Calendar windows in UTC, weeks from Monday; 5 hours from the first request after "
    "the last five hours ended."
)


def parse_usd(raw: str | None, *, allow_zero: bool) -> Decimal | None:
    """Return ``raw`` as USD, None when blank. :raise ValidationError: not such an amount."""
    if raw is None or not raw.strip():
        return None
    try:
        amount = Decimal(raw.strip().lstrip("$"))
    except InvalidOperation:
        raise ValidationError("Enter an amount in USD, such as 25 or 2.50.") from None
    if not amount.is_finite() or amount < 0:
        raise ValidationError("Enter zero or a positive amount.")
    if amount == 0 and not allow_zero:
        raise ValidationError("Enter an amount above zero.")
    if amount > MAX_USD or amount.as_tuple().exponent < -10:
        raise ValidationError("Enter at most $1,000,000, to at most 10 decimal places.")
    return amount


class KeyLimitsForm(FlaskForm):
    """The models a key may use (none chosen: all) and its monthly spend limit."""

    permitted_models = SelectMultipleField(
        "Permitted models",
        choices=[],
        validate_choice=False,
        description="Hold Ctrl or Cmd to choose several. None chosen: every model.",
    )
    monthly_limit = StringField(
        "Spend limit (USD)",
        description="Blank: no limit. Counted in the window below.",
    )
    limit_window = SelectField(
        "Limit window",
        choices=WINDOW_CHOICES,
        default=MONTH,
        description=WINDOW_HELP,
    )

    def validate_permitted_models(self, field: SelectMultipleField) -> None:
        """Refuse a model the catalog does not serve; none chosen is every model."""
        try:
            field.models = checked_permitted_models(field.data or None)
        except InvalidKeyLimits as error:
            raise ValidationError(str(error).capitalize() + ".") from None

    def validate_monthly_limit(self, field: StringField) -> None:
        """Refuse a negative or non-numeric limit."""
        amount = parse_usd(field.data, allow_zero=True)
        try:
            field.amount = checked_budget_amount(amount, "the monthly limit")
        except InvalidKeyLimits as error:
            raise ValidationError(str(error).capitalize() + ".") from None


class CreateKeyForm(KeyLimitsForm):
    """A new key's name, its limits, and for an admin the member it is for.

    The view gives ``member`` its choices (the organisation's members) for an admin or
    owner, and removes it for a member, whose keys are their own.
    """

    name = StringField("Key name", validators=[DataRequired(), Length(max=100)])
    member = SelectField("For member", coerce=int)


class GrantForm(FlaskForm):
    """An operator's grant of credits; the idempotency key makes a resubmission a no-op."""

    amount = StringField("Amount (USD)", validators=[DataRequired()])
    note = StringField("Note", validators=[Optional(), Length(max=120)])
    idempotency_key = HiddenField(validators=[DataRequired(), Length(max=64)])

    def validate_amount(self, field: StringField) -> None:
        """Refuse a non-positive or non-numeric amount."""
        field.amount = parse_usd(field.data, allow_zero=False)


ROLE_CHOICES = list(ROLES)


class InviteForm(FlaskForm):
    """Whom to invite into the organisation, and with what role."""

    email = EmailField(
        "Email",
        validators=[
            DataRequired(),
            Regexp(r"^[^@\s]+@[^@\s]+\.[^@\s]+$", message="Enter an email address."),
            Length(max=320),
        ],
    )
    role = SelectField("Role", choices=ROLE_CHOICES, default="member")


class BudgetForm(FlaskForm):
    """A member's budget: an amount in USD (blank: none) a window."""

    amount = StringField("Budget (USD)", description="Blank: no budget.")
    window = SelectField("Window", choices=WINDOW_CHOICES, default=MONTH, description=WINDOW_HELP)

    def validate_amount(self, field: StringField) -> None:
        """Refuse a negative or non-numeric amount."""
        amount = parse_usd(field.data, allow_zero=True)
        try:
            field.amount = checked_budget_amount(amount)
        except InvalidKeyLimits as error:
            raise ValidationError(str(error).capitalize() + ".") from None


class RoleForm(FlaskForm):
    """A member's new role."""

    role = SelectField("Role", choices=ROLE_CHOICES)


class OrganisationForm(FlaskForm):
    """A new organisation's name."""

    name = StringField("Name", validators=[DataRequired(), Length(max=200)])
