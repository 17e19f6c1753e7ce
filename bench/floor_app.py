"""The floor of the stack: a bare Flask view forwarding the body to the upstream.

It runs under the same gunicorn/gevent settings as the gateway and does the least any
gateway must: read the body, POST it with one ``requests.Session`` (no proxy lookup in
the environment), and relay the answer, streamed as it arrives when the caller asked for
a stream. No auth, no validation, no billing, no database. ``BENCH_UPSTREAM_URL`` is the
upstream's chat completions URL.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import requests
from flask import Flask, Response, request

READ_SIZE = 64 * 1024

app = Flask(__name__)
session = requests.Session()
session.trust_env = False
session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=100, max_retries=0))
UPSTREAM_URL = os.environ.get("BENCH_UPSTREAM_URL", "http://127.0.0.1:9100/v1/chat/completions")
HEADERS = {"Content-Type": "application/json"}


def relayed(upstream: requests.Response) -> Iterator[bytes]:
    """Yield the upstream's body as the socket delivers it, then release the connection."""
    try:
        while chunk := upstream.raw.read1(READ_SIZE):
            yield chunk
    finally:
        upstream.close()


@app.post("/v1/chat/completions")
def complete() -> Response:
    """Forward the body; relay the upstream's answer, streamed if it streams."""
    body = request.get_data()
    streamed = b'"stream":true' in body
    upstream = session.post(UPSTREAM_URL, data=body, headers=HEADERS, stream=streamed)
    mimetype = upstream.headers.get("Content-Type", "application/json")
    if streamed:
        return Response(relayed(upstream), status=upstream.status_code, mimetype=mimetype)
    return Response(upstream.content, status=upstream.status_code, mimetype=mimetype)


@app.get("/healthz")
def healthz() -> Response:
    """Answer while the process is up."""
    return Response(b"ok")
