"""Orchard Env's benchmarks and cost model: ``orchard-env-bench`` (also reached as
``orchard-env bench ...`` and ``orchard-env cost``).

Each bench (:mod:`.latency`, :mod:`.create`, :mod:`.bridge`, :mod:`.concurrency`) starts its
own throwaway server unless given ``--url``, prints a rich table (``--json`` for machines,
``--plot out.png`` for people) and never asserts a time. :mod:`.cost` prices a sandbox fleet
self-hosted next to a managed service; :mod:`.cli` holds the command line. Importing this
package imports none of them: ``orchard-env cost`` needs neither the client nor psutil.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
