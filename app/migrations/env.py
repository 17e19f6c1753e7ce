"""Alembic environment: migrate the database of the running Flask app."""

import logging

from alembic import context
from flask import current_app

log = logging.getLogger("alembic.env")
config = context.config
database = current_app.extensions["migrate"].db
config.set_main_option(
    "sqlalchemy.url",
    database.engine.url.render_as_string(hide_password=False).replace("%", "%%"),
)


def run_migrations_offline() -> None:
    """Emit the SQL of the migrations without a connection (``flask db upgrade --sql``)."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=database.metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the app's engine."""

    def skip_empty_autogenerate(context, revision, directives):  # noqa: ANN001
        if getattr(config.cmd_opts, "autogenerate", False) and directives[0].upgrade_ops.is_empty():
            directives[:] = []
            log.info("No changes in schema detected.")

    options = current_app.extensions["migrate"].configure_args
    options.setdefault("process_revision_directives", skip_empty_autogenerate)
    # Batch mode lets ALTER TABLE work on SQLite too, by rebuilding the table.
    options.setdefault("render_as_batch", True)
    with database.engine.connect() as connection:
        context.configure(connection=connection, target_metadata=database.metadata, **options)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
