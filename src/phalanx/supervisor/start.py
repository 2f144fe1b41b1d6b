"""How a round's workers are started: all at once (``LaunchAll``), so that a warm template
forks them from one request (``phalanx.supervisor.warm``), or one by one (``one_by_one``:
each exec'd by the agent, a cold start)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from phalanx.plan import WorkerPlan
from phalanx.supervisor.process import RunningWorker

Launch = Callable[[WorkerPlan], RunningWorker]
# One entry per worker, in order, until the first that could not start: its exception (what
# starting it raised) ends the list, and the workers after it are not started. The caller
# supervises (and so stops) every worker started, whatever the list ends with.
Started = list[RunningWorker | BaseException]
LaunchAll = Callable[[Sequence[WorkerPlan]], Started]


def one_by_one(launch: Launch) -> LaunchAll:
    """``launch`` for each worker in turn, stopping at the first that raises."""

    def launch_all(workers: Sequence[WorkerPlan]) -> Started:
        started: Started = []
        for worker in workers:
            try:
                started.append(launch(worker))
            except BaseException as exc:  # handed back: the caller raises it once all are watched
                started.append(exc)
                break
        return started

    return launch_all
