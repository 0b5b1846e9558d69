"""``orchard-env bench ...``: the service's speed and scale, next to direct baselines.

Each bench starts its own throwaway server unless given ``--url``, prints a rich table
(``--json`` for machines, ``--plot out.png`` for people) and never asserts a time.
"""

from .bridge import bench_bridge, plot_bridge, print_bridge
from .common import OwnServer, percentiles
from .concurrency import bench_concurrency, plot_concurrency, print_concurrency
from .create import bench_create, plot_create, print_create
from .latency import bench_latency, plot_latency, print_latency

__all__ = [
    "OwnServer",
    "bench_bridge",
    "bench_concurrency",
    "bench_create",
    "bench_latency",
    "percentiles",
    "plot_bridge",
    "plot_concurrency",
    "plot_create",
    "plot_latency",
    "print_bridge",
    "print_concurrency",
    "print_create",
    "print_latency",
]
