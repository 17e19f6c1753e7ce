"""Gunicorn settings: gevent workers, so long-lived streams do not hold a process each."""

import os
import sys

from gevent import monkey

# Patch the master too, before on_starting imports the app: forked workers inherit its
# modules, and urllib3 keeps direct references to ssl's classes, which a worker's own
# patching comes too late to replace; HTTPS calls to upstreams would then block the
# whole worker instead of yielding to other requests.
monkey.patch_all()

bind = f"0.0.0.0:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "gevent"
worker_connections = int(os.environ.get("WORKER_CONNECTIONS", "1000"))
# gevent workers heartbeat from their own loop; this only catches a truly stuck worker.
timeout = 60
graceful_timeout = 30
# Longer than nginx's and load balancers' upstream keep-alive, so they close first.
keepalive = 75
accesslog = "-"
errorlog = "-"
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def on_starting(server):  # noqa: ANN001, ANN201
    """Refuse to start, in one line, when the configuration or the catalog is wrong."""
    sys.path.insert(0, os.getcwd())
    from app.catalog.registry import load_catalog
    from config.settings import ConfigurationError, config_class, settings_from_environment

    try:
        config_class()
        settings = settings_from_environment(os.environ)
        load_catalog(settings.get("MODEL_CATALOG", config_class().MODEL_CATALOG))
    except ConfigurationError as error:
        sys.exit(f"configuration error: {error}")


def post_fork(server, worker):  # noqa: ANN001, ANN201
    """Make psycopg2 cooperative, so a slow query yields to other greenlets."""
    from psycopg2.extensions import set_wait_callback

    from app.database import wait_cooperatively

    set_wait_callback(wait_cooperatively)


def post_worker_init(worker):  # noqa: ANN001, ANN201
    """Start the worker's sweeper of expired holds, beside the requests it serves."""
    import gevent

    from app.credits.sweeper import run_sweeper

    gevent.spawn(run_sweeper, worker.wsgi)
