"""Settings classes, one per environment, filled from the process environment in one place."""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class ConfigurationError(Exception):
    """The operator's configuration cannot be used; the message says what to fix."""


class Config:
    """Defaults shared by every environment."""

    ENV_NAME = "base"
    TESTING = False
    SQLALCHEMY_DATABASE_URI: str | None = None
    SQLALCHEMY_ENGINE_OPTIONS: dict[str, Any] = {}
    # Connections each worker keeps per engine (two engines on PostgreSQL), and never
    # more: a request finding them all in use waits for one. A gevent worker's many
    # requests each hold one only for a statement or a transaction, so a few serve
    # them all. Beyond them, connections opened for a burst and closed after it cost
    # PostgreSQL more than the statements they run (a new server process each), and the
    # more backends race for one account's row, the more CPU each request costs the
    # server (at 64 requests at once, twice as much with 10 + 10 per engine as with 5).
    DATABASE_POOL_SIZE = 5
    # A pooled connection unused this long is checked with a ping before it is used again.
    DATABASE_IDLE_PING_SECONDS = 10
    SECRET_KEY: str | None = None
    REDIS_URL: str | None = None
    # Redis only shares rate-limit counters: a Redis that does not answer within this is
    # treated as down, and each worker counts in its own memory until it is back.
    REDIS_TIMEOUT_SECONDS = 0.25
    # An unreachable database host fails a connection attempt after this, not the OS's minutes.
    DATABASE_CONNECT_TIMEOUT_SECONDS = 3
    # Requests per API key, in the limits library's notation; "off" disables the limit.
    RATE_LIMIT = "600 per minute"
    MODEL_CATALOG = str(PROJECT_ROOT / "config" / "models.toml")
    # Base64 images make chat bodies large; beyond this the body is refused with 413.
    MAX_CONTENT_LENGTH = 16 * 1024 * 1024
    # A hold outlives its request only when the worker died; it is released after this long.
    HOLD_TTL_SECONDS = 900
    # A stored Responses API response (``store``) is kept this long, then the sweeper deletes it.
    RESPONSES_TTL_DAYS = 30
    # Days raw generation records are kept; None keeps them forever. Older ones are
    # pruned by every worker's sweeper; the ledger and the usage rollups stay.
    GENERATION_RETENTION_DAYS: int | None = None
    # How often a worker records what its streams delivered (one UPDATE for all of them).
    # A killed worker's stream is billed from its last record: at it once the upstream
    # had ended the generation, else at the most the request could produce.
    STREAM_PROGRESS_SECONDS = 1.0
    JSON_SORT_KEYS = False
    # Whether the dashboard lets anyone sign up; when "closed", operators invite.
    SIGNUP = "open"
    # Where e-mail goes out (app.mail): smtp://, smtp+starttls:// or smtps://, with the
    # user and password in the URL if the server wants them. Unset, nothing is mailed
    # (an invite's link is shown to whoever made it instead).
    SMTP_URL: str | None = None
    MAIL_FROM = "gateway@localhost"
    # The dashboard's address as its users reach it, for the links it mails out (password
    # links, sign-up confirmations, invites); unset: the address each request came to.
    PUBLIC_URL: str | None = None
    # How often each worker's background deliverer sends the alert events waiting.
    ALERTS_POLL_SECONDS = 2.0
    # Private networks (comma-separated CIDRs) alert webhooks may be sent to; public
    # addresses always may (app.alerts.networks).
    ALERT_WEBHOOK_NETWORKS = ""
    # Dashboard sessions: the cookie is out of scripts' reach and not sent cross-site.
    SESSION_COOKIE_HTTPONLY = True
    SESSION_COOKIE_SAMESITE = "Lax"
    # The dashboard's forms check their CSRF token themselves; the API has none to check.
    WTF_CSRF_CHECK_DEFAULT = False
    # Sign-in attempts, per email and per client address (the limits library's notation).
    SIGN_IN_LIMIT_PER_EMAIL = "5 per minute;20 per hour"
    SIGN_IN_LIMIT_PER_ADDRESS = "20 per minute;100 per hour"
    # "text" for people, "json" for one JSON object per line.
    LOG_FORMAT = "text"
    # Bearer token GET /metrics requires; unset, /metrics is not served.
    METRICS_TOKEN: str | None = None
    # Proxies in front whose X-Forwarded-For/-Proto are trusted: how many, and from where.
    PROXY_HOPS = 0
    FORWARDED_ALLOW_IPS = "127.0.0.1"
    # Stripe (app.payments): the API key (unset: holders cannot buy credits), the secret
    # that verifies its webhook, and another address for its API (the tests' server).
    STRIPE_SECRET_KEY: str | None = None
    STRIPE_WEBHOOK_SECRET: str | None = None
    STRIPE_API_BASE: str | None = None
    # What a holder may buy at once, in USD, and the fee (percent) added on top of it.
    TOPUP_MIN_USD = Decimal(5)
    TOPUP_MAX_USD = Decimal(10000)
    TOPUP_FEE_PERCENT = Decimal(0)
    # The Ed25519 private key (PEM) that signs ledger statements (app.ledger_statements);
    # unset: one made once in the instance folder, but none in production.
    LEDGER_SIGNING_KEY: str | None = None


class DevelopmentConfig(Config):
    """A laptop or a fresh checkout: SQLite in the instance folder, a generated secret."""

    ENV_NAME = "development"


class TestingConfig(Config):
    """The test suite: its own database, given by the fixtures."""

    ENV_NAME = "testing"
    TESTING = True
    SECRET_KEY = "testing-only-secret"
    # The tests' webhook receivers listen on this machine.
    ALERT_WEBHOOK_NETWORKS = "127.0.0.0/8,::1/128"


class ProductionConfig(Config):
    """A deployed service: DATABASE_URL and SECRET_KEY come from the platform."""

    ENV_NAME = "production"
    SIGNUP = "closed"
    SESSION_COOKIE_SECURE = True


CONFIGS: dict[str, type[Config]] = {
    "development": DevelopmentConfig,
    "testing": TestingConfig,
    "production": ProductionConfig,
}


def normalize_database_url(url: str) -> str:
    """Name the psycopg (3) driver for every PostgreSQL URL.

    PaaS platforms hand out ``postgres://``, which SQLAlchemy refuses; a URL written for
    psycopg2 (``postgresql+psycopg2://``), which this project no longer ships, names the
    same server: the hot path's statements are bound and prepared through psycopg's own
    interface, so every PostgreSQL URL is served by it.
    """
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def database_engine_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return the engine options for the configured database.

    A pool of DATABASE_POOL_SIZE connections without overflow, and on PostgreSQL a
    connect timeout; options the configuration names itself are kept.
    """
    options = dict(config.get("SQLALCHEMY_ENGINE_OPTIONS") or {})
    options.setdefault("pool_size", config["DATABASE_POOL_SIZE"])
    options.setdefault("max_overflow", 0)
    if str(config.get("SQLALCHEMY_DATABASE_URI") or "").startswith("postgresql"):
        connect_args = dict(options.get("connect_args") or {})
        connect_args.setdefault("connect_timeout", config["DATABASE_CONNECT_TIMEOUT_SECONDS"])
        options["connect_args"] = connect_args
    return {"SQLALCHEMY_ENGINE_OPTIONS": options}


def _log_format(value: str) -> str:
    if value not in ("text", "json"):
        raise ValueError("must be text or json")
    return value


def _hop_count(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError("must be 0 or a positive integer")
    return number


def _positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError("must be a positive integer")
    return number


def _networks(value: str) -> str:
    for part in value.split(","):
        if part.strip():
            ipaddress.ip_network(part.strip(), strict=False)
    return value


def _usd(value: str) -> Decimal:
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise ValueError("must be an amount in USD") from None
    if not amount.is_finite() or amount <= 0 or amount != amount.quantize(Decimal("0.01")):
        raise ValueError("must be a positive amount in USD, in whole cents")
    return amount


def _percent(value: str) -> Decimal:
    try:
        percent = Decimal(value)
    except InvalidOperation:
        raise ValueError("must be a percentage") from None
    if not percent.is_finite() or not 0 <= percent < 100:
        raise ValueError("must be a percentage from 0 to under 100")
    return percent


def _ed25519_pem(value: str) -> str:
    try:
        key = serialization.load_pem_private_key(value.encode(), password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("must be an unencrypted Ed25519 private key in PEM")
    return value


def _signup_mode(value: str) -> str:
    if value not in ("open", "closed"):
        raise ValueError("must be open or closed")
    return value


# Every environment variable the application reads, with its setting name and coercer.
ENVIRONMENT_MAP: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
    ("DATABASE_URL", "SQLALCHEMY_DATABASE_URI", normalize_database_url),
    ("SECRET_KEY", "SECRET_KEY", str),
    ("REDIS_URL", "REDIS_URL", str),
    ("RATE_LIMIT", "RATE_LIMIT", str),
    ("MODEL_CATALOG", "MODEL_CATALOG", str),
    ("HOLD_TTL_SECONDS", "HOLD_TTL_SECONDS", _positive_int),
    ("RESPONSES_TTL_DAYS", "RESPONSES_TTL_DAYS", _positive_int),
    ("GENERATION_RETENTION_DAYS", "GENERATION_RETENTION_DAYS", _positive_int),
    ("DATABASE_POOL_SIZE", "DATABASE_POOL_SIZE", _positive_int),
    ("SIGNUP", "SIGNUP", _signup_mode),
    ("LOG_FORMAT", "LOG_FORMAT", _log_format),
    ("METRICS_TOKEN", "METRICS_TOKEN", str),
    ("PROXY_HOPS", "PROXY_HOPS", _hop_count),
    ("FORWARDED_ALLOW_IPS", "FORWARDED_ALLOW_IPS", str),
    ("SMTP_URL", "SMTP_URL", str),
    ("MAIL_FROM", "MAIL_FROM", str),
    ("PUBLIC_URL", "PUBLIC_URL", str),
    ("ALERT_WEBHOOK_NETWORKS", "ALERT_WEBHOOK_NETWORKS", _networks),
    ("STRIPE_SECRET_KEY", "STRIPE_SECRET_KEY", str),
    ("STRIPE_WEBHOOK_SECRET", "STRIPE_WEBHOOK_SECRET", str),
    ("STRIPE_API_BASE", "STRIPE_API_BASE", str),
    ("TOPUP_MIN_USD", "TOPUP_MIN_USD", _usd),
    ("TOPUP_MAX_USD", "TOPUP_MAX_USD", _usd),
    ("TOPUP_FEE_PERCENT", "TOPUP_FEE_PERCENT", _percent),
    ("LEDGER_SIGNING_KEY", "LEDGER_SIGNING_KEY", _ed25519_pem),
)

# Variables whose value an error message must not repeat.
SECRET_VARIABLES = frozenset({"LEDGER_SIGNING_KEY"})


def settings_from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """Read the variables of ENVIRONMENT_MAP that are set, coerced to their setting's type."""
    settings: dict[str, Any] = {}
    for variable, setting, coerce in ENVIRONMENT_MAP:
        raw = environ.get(variable)
        if raw in (None, ""):
            continue
        try:
            settings[setting] = coerce(raw)
        except ValueError as exc:
            shown = variable if variable in SECRET_VARIABLES else f"{variable}={raw!r}"
            raise ConfigurationError(f"{shown}: {exc}") from None
    return settings


def config_class(name: str | None = None) -> type[Config]:
    """Return the settings class named by ``name`` or by APP_ENV (default: development)."""
    name = name or os.environ.get("APP_ENV", "development")
    try:
        return CONFIGS[name]
    except KeyError:
        raise ConfigurationError(
            f"APP_ENV={name!r} is not one of {', '.join(sorted(CONFIGS))}"
        ) from None


def instance_defaults(config: Mapping[str, Any], instance_path: str) -> dict[str, Any]:
    """Fill what a development instance keeps in its folder: the SQLite file and the secret."""
    defaults: dict[str, Any] = {}
    folder = Path(instance_path)
    if not config.get("SQLALCHEMY_DATABASE_URI"):
        if config.get("ENV_NAME") == "production":
            raise ConfigurationError("DATABASE_URL is required in production")
        folder.mkdir(parents=True, exist_ok=True)
        defaults["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{folder / 'gateway.sqlite3'}"
    if not config.get("SECRET_KEY"):
        if config.get("ENV_NAME") == "production":
            raise ConfigurationError("SECRET_KEY is required in production")
        defaults["SECRET_KEY"] = _instance_secret(folder / "secret_key")
    return defaults


def _instance_secret(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_text(secrets.token_urlsafe(48))
        path.chmod(0o600)
    return path.read_text().strip()
