"""``launcher.json``'s start time is read from ``/proc`` (the agent does not import psutil to
write it): it is psutil's ``create_time``, which the readers compare it with."""

from __future__ import annotations

import psutil

from phalanx.status.launcher import started, this_process


def test_the_start_time_is_psutils_create_time() -> None:
    assert abs(started() - psutil.Process().create_time()) < 0.05
    mine = this_process()
    assert mine["pid"] == psutil.Process().pid
    assert abs(float(mine["started"]) - psutil.Process().create_time()) < 0.05  # type: ignore[arg-type]
