"""The application factory."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Flask

from app.auth.caller_cache import init_caller_cache
from app.catalog.registry import init_catalog
from app.dashboard.session import init_sessions
from app.database import init_database
from app.encoding import OrjsonProvider
from app.errors import register_envelope, register_errorhandlers
from app.extensions import API_PREFIX, GEMINI_PREFIX, csrf, db, migrate
from app.observability import init_observability
from app.providers.cooldown import upstream_cooldowns
from app.ratelimits import init_rate_limits, limiter
from config.settings import (
    config_class,
    database_engine_options,
    instance_defaults,
    settings_from_environment,
)

MIGRATIONS_DIRECTORY = str(Path(__file__).parent / "migrations")


def create_app(config_name: str | None = None, overrides: Mapping[str, Any] | None = None) -> Flask:
    """Build the app for ``config_name`` (or APP_ENV), environment and ``overrides`` applied."""
    app = Flask(__name__, instance_relative_config=True)
    app.json = OrjsonProvider(app)
    app.config.from_object(config_class(config_name))
    app.config.update(settings_from_environment(os.environ))
    app.config.update(overrides or {})
    app.config.update(instance_defaults(app.config, app.instance_path))
    app.config.update(database_engine_options(app.config))
    init_observability(app)
    register_extensions(app)
    register_blueprints(app)
    register_errorhandlers(app)
    register_commands(app)
    return app


def register_extensions(app: Flask) -> None:
    """Bind the database, remembered callers, migrations, rate limits, catalog and sessions."""
    init_database(app)
    init_caller_cache(app)
    migrate.init_app(app, db, directory=MIGRATIONS_DIRECTORY)
    init_rate_limits(app)
    init_catalog(app)
    csrf.init_app(app)
    init_sessions(app)
    upstream_cooldowns.configure(redis_url=app.config.get("REDIS_URL"))


def register_blueprints(app: Flask) -> None:
    """Mount the API under /v1, the probes, the metrics and the dashboard at the root."""
    from app import openapi
    from app.billing import views as billing_views
    from app.catalog import views as catalog_views
    from app.completions import views as completion_views
    from app.credits import views as credit_views
    from app.dashboard import (
        access,  # noqa: F401  (adds its pages to the blueprint)
        alerts,  # noqa: F401  (adds its page to the blueprint)
        billing,  # noqa: F401  (adds the Balance page to the blueprint)
        organisations,  # noqa: F401  (adds its pages to the blueprint)
        statements,  # noqa: F401  (adds the Balance page's downloads to the blueprint)
    )
    from app.dashboard import views as dashboard_views
    from app.embeddings import views as embedding_views
    from app.gemini import errors as gemini_errors
    from app.gemini import views as gemini_views
    from app.generations import views as generation_views
    from app.ledger_statements import views as statement_views
    from app.messages import errors as message_errors
    from app.messages import views as message_views
    from app.monitoring import health
    from app.monitoring import metrics as metrics_views
    from app.responses import views as response_views

    app.register_blueprint(health.bp)
    limiter.exempt(health.bp)
    app.register_blueprint(metrics_views.bp)
    limiter.exempt(metrics_views.bp)
    app.register_blueprint(openapi.bp, url_prefix=API_PREFIX)
    limiter.exempt(openapi.bp)
    app.register_blueprint(catalog_views.bp, url_prefix=API_PREFIX)
    app.register_blueprint(completion_views.bp, url_prefix=API_PREFIX)
    app.register_blueprint(credit_views.bp, url_prefix=API_PREFIX)
    app.register_blueprint(response_views.bp, url_prefix=API_PREFIX)
    app.register_blueprint(message_views.bp, url_prefix=API_PREFIX)
    app.register_blueprint(gemini_views.bp, url_prefix=GEMINI_PREFIX)
    app.register_blueprint(gemini_views.bp_v1, url_prefix=API_PREFIX)
    catalog_views.register_model_shape(app, gemini_views.MODEL_SHAPE)
    app.register_blueprint(embedding_views.bp, url_prefix=API_PREFIX)
    # Anthropic's clients read errors in Anthropic's envelope: on the Messages door's
    # paths, and on the model list when they say their API version. Google's read
    # Google's: under /v1beta, and under /v1/models on its calls or with its key.
    register_envelope(app, f"{API_PREFIX}/messages", message_errors.render)
    register_envelope(app, GEMINI_PREFIX + "/", gemini_errors.render)
    register_envelope(app, f"{API_PREFIX}/models", gemini_errors.render_for_google_callers)
    register_envelope(app, f"{API_PREFIX}/models", message_errors.render_for_anthropic_callers)
    app.register_blueprint(generation_views.bp, url_prefix=API_PREFIX)
    app.register_blueprint(statement_views.bp, url_prefix=API_PREFIX)
    # The public key is for anyone checking a statement: no key, no rate limit.
    app.register_blueprint(statement_views.well_known)
    limiter.exempt(statement_views.well_known)
    app.register_blueprint(dashboard_views.bp)
    # Stripe signs its events; a rate limit is for API keys, which it has none of.
    app.register_blueprint(billing_views.bp)
    limiter.exempt(billing_views.bp)


def register_commands(app: Flask) -> None:
    """Add the operator commands to ``flask``."""
    from app import cli

    cli.register(app)
