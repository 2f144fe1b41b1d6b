"""Warm start from the user's warm service (``--keep-warm SECONDS``), the agent's side.

``open_warm`` connects to the service of this launch's key (``phalanx.service.client``,
which starts it if none runs) and returns a ``ServiceTemplate``: the per-run ``Template``'s
protocol over that connection, so the supervisor sees no difference. When the service
cannot be reached, refuses this job, fails to import, or dies during the run, one line
says so and the workers fork from a fresh per-run template from then on (``open_template``,
today's path; if that fails too, they start cold). Closing the connection ends the session:
the service kills whatever of this run's workers is left.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phalanx.config import WorkersConfig
from phalanx.plan import WorkerPlan
from phalanx.service.client import Connection, connect
from phalanx.service.paths import UnsafeDirectory
from phalanx.supervisor.process import RunningWorker, exec_worker
from phalanx.supervisor.warm import WARM_MODES, Template, open_template, template_env
from phalanx.worker.protocol import ProtocolError

log = logging.getLogger("phalanx")


class ServiceTemplate(Template):
    """A session with the warm service; a fresh per-run template once it is given up."""

    def __init__(
        self,
        conn: Connection,
        workers: WorkersConfig,
        base_env: Mapping[str, str],
        run_dir: Path,
    ) -> None:
        super().__init__(None, conn.sock, None, conn.path.with_suffix(".log"))
        self._conn = conn
        self._fresh_args = (workers, base_env, run_dir)
        self._fresh: Template | None = None
        self._service_pid = 0

    @property
    def pid(self) -> int:
        return self._service_pid

    def _on_ready(self, message: dict[str, Any]) -> None:
        self._service_pid = int(message["ready"])
        log.info(
            "warm service: workers fork from service pid %d (%s; key %s)",
            self._service_pid,
            f"started by this launch, imports took {message.get('seconds', 0.0):.1f} s"
            if self._conn.started
            else "already warm",
            self._conn.key,
        )

    def _failed(self, why: str) -> str:
        return f"the service {why}"  # "refused this job: ..." or "could not import: ..."

    def _give_up(self, reason: str) -> None:
        if self._state != "gone":
            self._state = "gone"
            log.warning(
                "warm service unavailable (%s; see %s); workers fork from a fresh template",
                reason,
                self._log_path,
            )
            self._fresh = open_template(*self._fresh_args)

    def _instead(self, worker: WorkerPlan) -> RunningWorker:
        return self._fresh.launch(worker) if self._fresh is not None else exec_worker(worker)

    def close(self) -> None:
        super().close()  # the service kills this run's workers that are left, and stays
        if self._fresh is not None:
            self._fresh.close()


def open_warm(
    workers: WorkersConfig, base_env: Mapping[str, str], run_dir: Path
) -> Template | None:
    """This run's warm start: the warm service's session with ``--keep-warm``, else (or when
    it cannot be had, said in one line) a per-run template, or None for a cold start."""
    if workers.keep_warm <= 0 or not workers.warm_start or workers.mode not in WARM_MODES:
        return open_template(workers, base_env, run_dir)
    try:
        conn = connect(
            template_env(workers, base_env), workers.preload, workers.keep_warm, os.getcwd()
        )
    except (OSError, ProtocolError, UnsafeDirectory) as exc:
        log.warning("warm service unavailable (%s); workers fork from a fresh template", exc)
        return open_template(workers, base_env, run_dir)
    return ServiceTemplate(conn, workers, base_env, run_dir)
