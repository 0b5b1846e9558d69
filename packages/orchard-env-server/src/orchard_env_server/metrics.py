"""Prometheus metrics of the service, in one private registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

REQUESTS = Counter(
    "orchard_http_requests_total",
    "HTTP requests by route and status",
    ["method", "route", "status"],
    registry=REGISTRY,
)
LATENCY = Histogram(
    "orchard_http_request_seconds",
    "HTTP request latency by route",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
SANDBOXES = Gauge("orchard_sandboxes", "Sandboxes known to this replica", registry=REGISTRY)
REAPING = Gauge(
    "orchard_sandboxes_reaping",
    "Deleted sandboxes whose removal is still under way",
    registry=REGISTRY,
)
POOL_CLAIMS = Counter(
    "orchard_warm_pool_claims_total", "Creates served from a warm pool", registry=REGISTRY
)
INFLIGHT = Gauge("orchard_inflight_operations", "Operations in flight", registry=REGISTRY)
REJECTED = Counter(
    "orchard_rejected_total", "Requests refused with 503 because of load", registry=REGISTRY
)
CREATE_SECONDS = Histogram(
    "orchard_sandbox_create_seconds",
    "Create to ready",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)
CREATE_FAILURES = Counter(
    "orchard_sandbox_create_failures_total", "Sandboxes that never became ready", registry=REGISTRY
)
REAPED = Counter(
    "orchard_sandboxes_reaped_total", "Sandboxes deleted for TTL or idleness", registry=REGISTRY
)
