"""Gunicorn settings: gevent workers, so long-lived streams do not hold a process each."""

import glob
import os
import shutil
import sys
import tempfile

from gevent import monkey
from gunicorn.glogging import Logger

# Patch the master too, before on_starting imports the app: forked workers inherit its
# modules, and urllib3 keeps direct references to ssl's classes, which a worker's own
# patching comes too late to replace; HTTPS calls to upstreams would then block the
# whole worker instead of yielding to other requests. psycopg, likewise, picks how it
# waits for PostgreSQL when first imported: it yields to the worker's other greenlets
# (and enforces connect_timeout itself) once it finds select patched.
monkey.patch_all()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fresh_metrics_directory() -> str:
    """Return an empty PROMETHEUS_MULTIPROC_DIR, where workers write their metric samples.

    It must be set before prometheus_client is imported, and emptied at every start:
    files a previous run left would be summed into the new run's counters.
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        directory = tempfile.mkdtemp(prefix="gateway-metrics-")
    os.makedirs(directory, exist_ok=True)
    for samples in glob.glob(os.path.join(directory, "*.db")):
        os.remove(samples)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    return directory


metrics_directory_is_ours = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
metrics_directory = fresh_metrics_directory()


def listening_address(environ: dict[str, str]) -> str:
    """Return HOST, else loopback in development (the default) and every interface otherwise.

    A development server prints a demo key: only this machine should reach it unless
    HOST says otherwise. A deployed one is reached through its platform or proxy.
    """
    if environ.get("HOST"):
        return environ["HOST"]
    return "127.0.0.1" if environ.get("APP_ENV", "development") == "development" else "0.0.0.0"


host, port = listening_address(os.environ), os.environ.get("PORT", "8000")
# An IPv6 address is bracketed before its port, as gunicorn reads a bind.
bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "gevent"
worker_connections = int(os.environ.get("WORKER_CONNECTIONS", "1000"))
# Each worker listens on a socket of its own (SO_REUSEPORT), among which the kernel
# spreads new connections. On one shared socket, whichever worker wakes first accepts:
# a burst of keep-alive connections (a proxy's, a client's pool) could all land on one
# worker, which then served them alone while the other idled.
reuse_port = True
# gevent workers heartbeat from their own loop; this only catches a truly stuck worker.
timeout = 60
# On SIGTERM workers stop accepting and let streams in flight finish for this long.
graceful_timeout = 30
# gunicorn's runtime control socket defaults to one path per user, which every instance on
# the host would share (and fight over); nothing here manages workers through it.
control_socket_disable = True
# Longer than nginx's and load balancers' upstream keep-alive, so they close first.
keepalive = 75
# The app writes one access line per request itself (app/observability/logs.py), with
# the request id, caller ids, model, tokens and cost; gunicorn's would be a second line,
# and it logs the user of a Basic Authorization header, which can be an API key.
accesslog = None
errorlog = "-"
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def address_url(address: str) -> str:
    """Return a bind address as gunicorn names a listener: ``http://host:port``, or a socket."""
    return address if address.startswith(("unix:", "fd://")) else f"http://{address}"


class GatewayLogger(Logger):
    """gunicorn's own lines (boot, worker exits) in the app's format, and no access lines."""

    def setup(self, cfg):  # noqa: ANN001, ANN201
        """Set up as gunicorn does, then format as LOG_FORMAT says."""
        super().setup(cfg)
        from app.observability.logs import formatter_for

        for handler in self.error_log.handlers:
            handler.setFormatter(formatter_for(os.environ.get("LOG_FORMAT", "text")))

    def info(self, msg, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201
        """Log as gunicorn does, but name the address in its "Listening at" line.

        With reuse_port the master binds no socket, and gunicorn would list none there:
        the line would not say whether the server is reachable from other machines.
        """
        if msg.startswith("Listening at:") and args and not args[0]:
            args = (", ".join(map(address_url, self.cfg.bind)), *args[1:])
        super().info(msg, *args, **kwargs)

    def access(self, resp, req, environ, request_time):  # noqa: ANN001, ANN201
        """Write nothing: the app writes the request's one access line itself."""


logger_class = GatewayLogger


def on_starting(server):  # noqa: ANN001, ANN201
    """Refuse to start, in one line, when the configuration or the catalog is wrong."""
    from app.catalog.errors import CatalogError
    from app.catalog.registry import load_catalog
    from config.settings import ConfigurationError, config_class, settings_from_environment

    try:
        config_class()
        settings = settings_from_environment(os.environ)
        load_catalog(settings.get("MODEL_CATALOG", config_class().MODEL_CATALOG))
    except (ConfigurationError, CatalogError) as error:
        sys.exit(f"configuration error: {error}")


def when_ready(server):  # noqa: ANN001, ANN201
    """Say where the workers listen: with reuse_port the master binds no socket to log."""
    server.log.info("Workers listen at %s, each on a socket of its own", ", ".join(server.cfg.bind))


def post_worker_init(worker):  # noqa: ANN001, ANN201
    """Start the worker's renewals, sweeper and alert deliverer, beside its requests."""
    import gevent

    from app.sweeper import run_alert_deliverer, run_renewals, run_sweeper

    for loop in (run_renewals, run_sweeper, run_alert_deliverer):
        gevent.spawn(loop, worker.wsgi)


def on_exit(server):  # noqa: ANN001, ANN201
    """Remove the samples directory gunicorn made for itself; an operator's is kept."""
    if metrics_directory_is_ours:
        shutil.rmtree(metrics_directory, ignore_errors=True)


def child_exit(server, worker):  # noqa: ANN001, ANN201
    """Drop a dead worker's live gauges (streams in flight) from the metrics."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
