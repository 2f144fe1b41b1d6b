"""``--metrics-port``: this agent's events as Prometheus metrics, served over HTTP.

The numbers are kept from the event log (``EventLog.listen``), never from the agent's loop,
so they say exactly what ``events.jsonl`` says. ``prometheus_client`` (the ``phalanx[metrics]``
extra) is imported only when the flag is given, and the metrics live on a registry of their
own (not the library's global one, which a user's code in the same process could share).

Served: ``phalanx_restarts_total``, ``phalanx_failures_total{kind}``,
``phalanx_rendezvous_seconds`` (a histogram of each round's wait),
``phalanx_time_to_first_step_seconds`` (the last round: from the round formed to a rank's
first step), ``phalanx_steps_per_second{rank}`` and ``phalanx_step{rank}`` (between the last
two progress samples of a rank, taken every 2 s; a rank's rate is absent from a new round's
forming until two of its samples in that round), ``phalanx_straggler{rank}`` (1 while the
rank is named a straggler in the current round: ``stragglers.watch``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from phalanx.errors import UsageError

METRICS_EXTRA = "pip install 'phalanx[metrics]'"
RENDEZVOUS_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


def available() -> bool:
    """Whether ``prometheus_client`` can be imported (looked up, not imported)."""
    try:
        return importlib.util.find_spec("prometheus_client") is not None
    except ValueError:  # a module object without a spec stands in for it
        return True


class MetricsServer:
    """The registry, the metrics and the HTTP server on ``addr:port``. The port is bound in
    the constructor: a port in use is a ``UsageError`` before anything of the job starts."""

    def __init__(self, addr: str, port: int) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise UsageError(
                f"--metrics-port needs the prometheus-client library: {METRICS_EXTRA}"
            ) from None
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.restarts = prom.Counter(
            "phalanx_restarts", "Restarts of the worker group spent.", registry=r
        )
        self.failures = prom.Counter(
            "phalanx_failures", "Failed attempts, by failure kind.", ["kind"], registry=r
        )
        self.rendezvous = prom.Histogram(
            "phalanx_rendezvous_seconds", "Seconds this node waited for each round to form.",
            buckets=RENDEZVOUS_BUCKETS, registry=r,
        )  # fmt: skip
        self.first_step = prom.Gauge(
            "phalanx_time_to_first_step_seconds",
            "Seconds from the last round's forming to a rank's first step (to the agent's reading).",
            registry=r,
        )
        self.steps_per_second = prom.Gauge(
            "phalanx_steps_per_second", "Steps per second of each rank.", ["rank"], registry=r
        )
        self.step = prom.Gauge("phalanx_step", "The step each rank reached.", ["rank"], registry=r)
        self.straggler = prom.Gauge(
            "phalanx_straggler",
            "1 while a rank is named a straggler in the current round, else 0.",
            ["rank"],
            registry=r,
        )
        self._formed: float | None = None  # mono of the last rdzv_done, until a first step
        self._last: dict[int, tuple[float, int]] = {}  # rank -> (mono, step) last sample
        self._stragglers: set[str] = set()
        try:
            self._server, self._thread = prom.start_http_server(port, addr, registry=r)
        except OSError as exc:
            raise UsageError(
                f"--metrics-port {port}: cannot listen on {addr}:{port} "
                f"({exc.strerror or exc}); choose another port"
            ) from None

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def record(self, event: dict[str, Any]) -> None:
        """An ``EventLog`` listener: update the metrics from one event."""
        kind = event["kind"]
        if kind == "restart":
            self.restarts.inc()
        elif kind == "failure":
            self.failures.labels(kind=str(event.get("failure_kind") or "unknown")).inc()
        elif kind == "rdzv_done":
            self.rendezvous.observe(float(event.get("seconds") or 0.0))
            self._formed = float(event["mono"])
            # Rates start again in the new round: no old rate stands for a rank restarting.
            self.steps_per_second.clear()
            self._last.clear()
            for labels in list(self._stragglers):
                self.straggler.labels(rank=labels).set(0)  # judged afresh in the new round
            self._stragglers.clear()
        elif kind == "straggler" and event.get("rank") is not None:
            self._stragglers.add(str(event["rank"]))
            self.straggler.labels(rank=str(event["rank"])).set(1)
        elif kind == "progress" and event.get("step") is not None:
            self._progress(event)

    def _progress(self, event: dict[str, Any]) -> None:
        rank, step, mono = int(event["rank"]), int(event["step"]), float(event["mono"])
        if self._formed is not None:
            self.first_step.set(round(mono - self._formed, 3))
            self._formed = None
        self.step.labels(rank=str(rank)).set(step)
        previous = self._last.get(rank)
        if previous is not None and mono > previous[0]:
            self.steps_per_second.labels(rank=str(rank)).set(
                round((step - previous[1]) / (mono - previous[0]), 3)
            )
        self._last[rank] = (mono, step)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(2.0)
