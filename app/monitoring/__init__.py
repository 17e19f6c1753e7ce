"""The operator's door: liveness and readiness probes, and the Prometheus scrape."""
