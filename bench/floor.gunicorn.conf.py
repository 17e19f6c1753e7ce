"""The gateway's gunicorn settings for the floor, without the gateway's own hooks.

The settings (gevent workers, connections, timeouts, access log) are read from
config/gunicorn.conf.py itself, so the floor runs exactly as the gateway does; its hooks
(catalog check, the hold sweeper) belong to the gateway alone.
"""

from pathlib import Path

_source = Path(__file__).resolve().parent.parent / "config" / "gunicorn.conf.py"
# The settings file finds the project from its own path, as when gunicorn reads it.
_gateway: dict = {"__file__": str(_source)}
exec(compile(_source.read_text(), str(_source), "exec"), _gateway)

SETTINGS = (
    "bind",
    "workers",
    "worker_class",
    "worker_connections",
    "reuse_port",
    "timeout",
    "graceful_timeout",
    "keepalive",
    "accesslog",
    "errorlog",
    "forwarded_allow_ips",
    "control_socket_disable",
)
globals().update({name: _gateway[name] for name in SETTINGS})
