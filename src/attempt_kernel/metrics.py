"""Prometheus metrics from Python: what ``worker --metrics-port`` and ``serve``'s ``/metrics`` serve.

The contracts are docs/metrics.md's. `WorkerExposition` is what a worker
serves (its counters, and the journal's gauges); `metrics_app` is the
journal's gauges alone, one page per call (what the web view serves).

Needs the ``metrics`` extra (``pip install 'attempt-kernel[metrics]'``,
which brings prometheus_client); the rest of the library does not. Like
the package's own doorway, this module only binds names (from a private
module) and lists them once in ``__all__``.
"""

from ._metrics import WorkerExposition as WorkerExposition
from ._metrics import metrics_app as metrics_app

__all__ = ["WorkerExposition", "metrics_app"]
