"""``PreemptWatch``: which preemption signal is a second one (pure: no workers running).

A scheduler signals every node (``scancel --signal=TERM``), and each agent also hears the
first node's notice through the store: on a loaded host the notice can come first. Seen in
a CI run (``tests/slurm/test_slurm_preempt.py[TERM]``): node 1 heard node 0's notice, then
got its own SIGTERM, took it for a second signal and stopped its workers at once; the job
failed instead of exiting 75. The real-process form is
``tests/agent/test_preempt.py::test_a_nodes_own_signal_after_the_notice_is_not_a_second_one``.
"""

from __future__ import annotations

import signal

from phalanx.rendezvous.api import EventKind, JobEvent
from phalanx.supervisor.preempt import PreemptWatch

GRACE = 25.0


def _watch(announced: list[dict[str, object]]) -> PreemptWatch:
    def announce(notice: dict[str, object]) -> dict[str, object]:
        announced.append(notice)
        return notice

    return PreemptWatch(GRACE, announce, node_rank=1)


def _notice_from_node_0() -> JobEvent:
    notice = {"signal": "SIGTERM", "time": 1.0, "node": 0, "grace": GRACE}
    return JobEvent(EventKind.PREEMPTED, 0, "node 0 (node1) got SIGTERM", notice)


def test_a_first_signal_after_a_peers_notice_keeps_the_preemption_under_way() -> None:
    announced: list[dict[str, object]] = []
    watch = _watch(announced)
    watch.hear(_notice_from_node_0(), [])
    heard = watch.preemption
    assert heard is not None and heard.node == 0
    assert watch.begin(signal.SIGTERM, [])  # this node's own signal: not a second one
    assert watch.preemption is heard  # the same deadline, the first node's notice
    assert announced == []  # nothing to tell: the job knows
    assert not watch.begin(signal.SIGTERM, [])  # this node's second signal stops at once


def test_a_second_signal_to_this_node_stops_at_once() -> None:
    announced: list[dict[str, object]] = []
    watch = _watch(announced)
    assert watch.begin(signal.SIGUSR1, [])
    assert [n["node"] for n in announced] == [1]
    watch.hear(_notice_from_node_0(), [])  # (another node's notice meanwhile changes nothing)
    assert not watch.begin(signal.SIGUSR1, [])
