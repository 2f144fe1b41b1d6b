"""What the ssh controller says when a host's session is lost and the job could go on
without it (spare hosts, or a store that fails over): ``hosts.controller.lost_line`` as a
table. The real side (every session lost at once) is ``tests/cli/test_hosts_all_lost.py``."""

from __future__ import annotations

import pytest

from phalanx.hosts.controller import lost_line

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
