"""Prometheus metrics: OpenTelemetry GenAI names and units, plus the gateway's own.

Under gunicorn every worker writes its samples to files in ``PROMETHEUS_MULTIPROC_DIR``
(set up by config/gunicorn.conf.py) and a scrape sums them over the workers; without it
(the flask commands, the test client) they live in this process. No metric is labelled
by key or account: labels are routes, statuses, error codes, models and upstreams, all
bounded by the code and the catalog. A request costs a handful of observations, made
once when it ends (``observe_request``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

from app.observability.trace import RequestTrace
from app.process import process_id

MULTIPROCESS_DIRECTORY = "PROMETHEUS_MULTIPROC_DIR"
OPERATION = "chat"
# OpenTelemetry's advised boundaries for gen_ai.client.token.usage and for durations.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256)

if os.environ.get(MULTIPROCESS_DIRECTORY):
    # Every sample written checks that the process is still the one whose file it
    # writes to: with os.getpid() that was a system call per write.
    values.ValueClass = values.MultiProcessValue(process_id)

registry = CollectorRegistry()

request_duration = Histogram(
    "gen_ai_server_request_duration_seconds",
    "Time from a generation request's arrival to its last byte.",
    ["gen_ai_operation_name", "gen_ai_request_model", "error_type"],
    buckets=DURATION_BUCKETS,
    registry=registry,
)
time_to_first_token = Histogram(
    "gen_ai_server_time_to_first_token_seconds",
    "Time from a streamed request's arrival to its first generated token.",
    ["gen_ai_operation_name", "gen_ai_request_model"],
    buckets=DURATION_BUCKETS,
    registry=registry,
)
token_usage = Histogram(
    "gen_ai_client_token_usage",
    "Tokens billed per generation, by kind (input, output, cached, reasoning).",
    ["gen_ai_operation_name", "gen_ai_request_model", "gen_ai_token_type"],
    buckets=TOKEN_BUCKETS,
    registry=registry,
)
operation_duration = Histogram(
    "gen_ai_client_operation_duration_seconds",
    "Time of one call to an upstream, until its answer (or a stream's first chunk).",
    ["gen_ai_operation_name", "upstream", "outcome"],
    buckets=DURATION_BUCKETS,
    registry=registry,
)
requests_total = Counter(
    "gateway_requests",
    "Requests answered, by route, status and error code.",
    ["route", "status", "error_code"],
    registry=registry,
)
cost_total = Counter(
    "gateway_cost_usd",
    "USD charged to callers' balances, by model and the API the requests came in by.",
    ["model", "api"],
    registry=registry,
)
upstream_attempts = Counter(
    "gateway_upstream_attempts",
    "Calls to upstreams, by upstream and how each ended.",
    ["upstream", "outcome"],
    registry=registry,
)
streams_in_flight = Gauge(
    "gateway_streams_in_flight",
    "Event streams being written to callers now.",
    multiprocess_mode="livesum",
    registry=registry,
)
rate_limit_fallbacks = Counter(
    "gateway_rate_limit_store_fallbacks",
    "Times a worker found Redis unreachable and fell back to counting in its own memory.",
    registry=registry,
)
# Observed only when writes queued: a lone write's commit, the common case, costs nothing.
sqlite_shared_commit_writes = Histogram(
    "gateway_sqlite_shared_commit_writes",
    "Writes (holds, settlements, claims) each shared SQLite commit of a worker carried:"
    " they queued for the write lock and committed together.",
    buckets=(2, 4, 8, 16),
    registry=registry,
)
overhead = Histogram(
    "gateway_overhead_seconds",
    "Time the gateway itself added to a request: its duration minus upstream waits.",
    ["route"],
    buckets=OVERHEAD_BUCKETS,
    registry=registry,
)


def observe_request(trace: RequestTrace) -> None:
    """Record a finished request: its status, and what its generation ran and cost."""
    labelled(requests_total, trace.route, str(trace.status), trace.error_code or "").inc()
    labelled(overhead, trace.route).observe(trace.overhead_seconds())
    for attempt in trace.attempts:
        labelled(upstream_attempts, attempt.upstream, attempt.outcome).inc()
        labelled(operation_duration, OPERATION, attempt.upstream, attempt.outcome).observe(
            attempt.seconds
        )
    if trace.model is None:
        return
    model = trace.model
    labelled(request_duration, OPERATION, model, trace.error_code or "").observe(trace.elapsed())
    if trace.first_token_seconds is not None:
        labelled(time_to_first_token, OPERATION, model).observe(trace.first_token_seconds)
    if trace.cost:
        labelled(cost_total, model, trace.api or "").inc(float(trace.cost))
    observe_tokens(model, trace.usage)


def observe_tokens(model: str, usage: object) -> None:
    """Record a generation's tokens by kind; cached and reasoning only when there are some."""
    counts = {
        "input": getattr(usage, "prompt_tokens", 0),
        "output": getattr(usage, "completion_tokens", 0),
        "cached": getattr(usage, "cached_tokens", 0),
        "reasoning": getattr(usage, "reasoning_tokens", 0),
    }
    for kind, count in counts.items():
        if count or kind in ("input", "output"):
            labelled(token_usage, OPERATION, model, kind).observe(count)


# Each metric's children by their label values. ``labels()`` checks and converts its
# values and takes a lock on every call, nearly as long as the observation itself; the
# label values are few (routes, statuses, models...), so their children are kept here.
_children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}


def labelled(metric: MetricWrapperBase, *values: str) -> Any:
    """Return ``metric``'s child for the label ``values`` (strings, as Prometheus keeps them)."""
    key = (metric, values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


class SnapshotCollector:
    """Serves metric families read at scrape time (from the database, from Redis)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        """Yield the families read for this scrape."""
        yield from self.families


def gauge(name: str, documentation: str, value: float | Decimal) -> GaugeMetricFamily:
    """Build an unlabelled gauge family of one value."""
    return GaugeMetricFamily(name, documentation, value=float(value))


def render_metrics(scraped: Iterable[Metric]) -> bytes:
    """Return the Prometheus text of every worker's samples and of ``scraped`` families."""
    live = CollectorRegistry()
    if os.environ.get(MULTIPROCESS_DIRECTORY):
        MultiProcessCollector(live)
    else:
        live.register(SnapshotCollector(registry.collect()))
    live.register(SnapshotCollector(scraped))
    return generate_latest(live)
