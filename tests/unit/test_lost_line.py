"""What the ssh controller says when a host's session is lost and the job could go on
without it (spare hosts, or a store that fails over): ``hosts.controller.lost_line`` as a
table; the same for a host whose agent was cut off from the other members (exit 79) while
its session held (``cut_off_line``), and the job's exit status from the hosts' codes
(``_job_code``). The real side (every session lost at once) is
``tests/cli/test_hosts_all_lost.py``; a member cut off under ``--hostfile``,
``tests/multinode/test_store_failover.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from phalanx.hosts.controller import _job_code, cut_off_line, lost_line

# (sessions still running, the job's exit status, words the line has, words it has not)
CASES = [
    (2, 1, "the job goes on without it", "no session left"),
    (1, 0, "the job goes on without it", "ends here"),
    (0, 1, "the job has no session left (every host's was lost or ended): it ends here (exit 1)", "goes on"),
    (0, 3, "it ends here (exit 3)", "goes on"),
    (0, 0, "after the other hosts finished the job: it ends here (exit 0", "goes on"),
]  # fmt: skip


@pytest.mark.parametrize(("running", "code", "has", "lacks"), CASES)
def test_the_line_says_what_becomes_of_the_job(
    running: int, code: int, has: str, lacks: str
) -> None:
    line = lost_line("host2", running, code)
    assert line.startswith("phalanx: the ssh session to host2 was lost")
    assert has in line and lacks not in line, line


def test_a_cut_off_host_is_out_while_others_run_and_the_end_when_none_does() -> None:
    going = cut_off_line("host3", 2, 1)
    assert going.startswith("phalanx: host3's agent was cut off from the other members and left")
    assert going.endswith("the job goes on without it where a quorum of its members met")
    assert cut_off_line("host3", 0, 1).endswith("no other host runs the job any more: it ends here (exit 1)")  # fmt: skip
    assert cut_off_line("host3", 0, 0).endswith("after the other hosts finished the job: it ends here (exit 0)")  # fmt: skip


# (the hosts' exit codes in the order they ended, whether a member may be lost, the job's)
CODES = [
    ([79, 0, 0], True, 0),  # one cut off, the others finished: the job did
    ([0, 0, 79], True, 0),
    ([79, 255, 0], True, 0),
    ([79, 1, 1], True, 1),  # the others failed: their code, not the cut-off's
    ([79, 79, 79], True, 79),  # every host out (a worker's own exit 79 everywhere: the same)
    ([79, 255], True, 1),
    ([79, 0], False, 79),  # a job that cannot go on without a host: 79 is a failure there
    ([255, 0], False, 1),
]


@pytest.mark.parametrize(("codes", "tolerate", "job"), CODES)
def test_a_cut_off_host_is_not_the_jobs_failure_where_it_goes_on(
    codes: list[int], tolerate: bool, job: int
) -> None:
    sessions = [
        SimpleNamespace(ended_at=float(i), proc=SimpleNamespace(returncode=code))
        for i, code in enumerate(codes)
    ]
    assert _job_code(sessions, tolerate_lost=tolerate) == job  # type: ignore[arg-type]


# (the hosts' exit codes in order, whether the others go on without an excluded host, the job's)
EXCLUDED_CODES = [
    ([69, 0], True, 0),  # excluded, the other finished: the job did (tests/cli/test_hosts_excluded.py)
    ([69, 3], True, 3),  # the other failed: its code
    ([69, 69], True, 69),  # every host excluded
    ([69, 0], False, 69),  # a job that needs every host: the exclusion ended it
]  # fmt: skip


@pytest.mark.parametrize(("codes", "going_on", "job"), EXCLUDED_CODES)
def test_an_excluded_host_is_not_the_jobs_failure_where_the_others_go_on(
    codes: list[int], going_on: bool, job: int
) -> None:
    sessions = [
        SimpleNamespace(ended_at=float(i), proc=SimpleNamespace(returncode=code))
        for i, code in enumerate(codes)
    ]
    assert _job_code(sessions, excluded_out=going_on) == job  # type: ignore[arg-type]
