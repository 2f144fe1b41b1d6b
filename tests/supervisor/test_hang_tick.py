"""The hang watch and the agent's tick: a naming's stack dump never holds the tick (another
rank's death during it is acted on at once), and a hung rank's round fails at the watch's own
deadline, not at the next tick. Real workers, real Gloo, a rank that really sleeps, a py-spy
stand-in on PATH that really takes its time; what happened is read from the files, never
timed: each test can only pass through the mechanism (a tick 10 minutes away, a dump that
ends only when its process does)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from phalanx.resources.ports import free_port
from phalanx.worker.contract import STACK_SIGNAL
from support.hosts import Node
from support.launch import launched, wait_for, worker
from support.multinode import c10d_args

SCRIPT = worker("steps_then_hang.py")
# A py-spy that "dumps" as long as its process lives (a minute at most): the naming's dump
# lasts until the rank is stopped, and the file says which came first.
STAND_IN = """#!{python}
import os, sys, time
from pathlib import Path

pid = int(sys.argv[sys.argv.index("--pid") + 1])
(Path(os.environ["STAND_IN_MARKS"]) / f"{{pid}}.started").write_text("")
for _ in range(1200):
    try:
        with open(f"/proc/{{pid}}/stat") as stat:
            if stat.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                break
    except OSError:
        break
    time.sleep(0.05)
else:
    sys.exit("stand-in: gave up after a minute")
print(f"stand-in: pid {{pid}} ended while it was dumped", flush=True)
"""
# The watch's pace set far apart: a tick every 10 minutes (so only the watch's own deadlines
# make it look), a rhythm at once (grace 3 s, floor 1 s, factor 1): named a second after its
# last step, failed ten seconds after it.
PACE = ["--monitor-interval", "600", "--hang-watch", "floor=1,factor=1,grace=3"]
TICKS_TO_THE_INTERVAL = 13  # 0.1 s doubled 13 times: past 600 s


def _stand_in(tmp_path: Path) -> dict[str, str]:
    """The environment of an agent whose py-spy is the stand-in; its marks in tmp/marks."""
    bin_dir, marks = tmp_path / "bin", tmp_path / "marks"
    bin_dir.mkdir()
    marks.mkdir()
    exe = bin_dir / "py-spy"
    exe.write_text(STAND_IN.format(python=sys.executable))
    exe.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "STAND_IN_MARKS": str(marks)}


def test_a_rank_killed_during_a_slow_naming_dump_is_acted_on_before_the_dump_ends(
    tmp_path: Path,
) -> None:
    """Rank 1 sleeps; both ranks are named at the 1 s floor and dumped, and py-spy (the
    stand-in) dumps until its rank is gone. Rank 0 is SIGKILLed meanwhile: the agent stops
    the round for it while the dump of rank 1 still runs, so rank 1's py-spy sees its rank
    stopped. A tick held by the dump would act only when py-spy is given up on (10 s) and
    killed, rank 1 still running. The naming's report is still written, before the round's
    failure is said."""
    env, pids, logs = _stand_in(tmp_path), tmp_path / "pids", tmp_path / "logs"
    pids.mkdir()
    args = ["--nproc-per-node", "2", "--max-restarts", "0", "--hang-watch", "floor=1,factor=3",
            "--log-dir", str(logs), SCRIPT, "20", "1", str(pids)]  # fmt: skip
    with launched(args, env=env) as agent:
        started = tmp_path / "marks"
        wait_for(lambda: len(list(started.glob("*.started"))) == 2, 60, "both ranks' dumps")
        os.kill(int((pids / "0.pid").read_text()), signal.SIGKILL)
        _, err = agent.communicate(timeout=60)
    assert agent.returncode != 0, err
    (run_dir,) = logs.iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["root_cause"]["rank"] == 0, report  # its death, not the hang
    attempt = run_dir / "attempt_0"
    native = (attempt / "rank_1" / "py-spy.txt").read_text()
    rank1 = int((pids / "1.pid").read_text())
    assert f"stand-in: pid {rank1} ended while it was dumped" in native, native
    assert "gave no dump" not in native, native
    named = (attempt / "hang_report.txt").read_text()
    assert "named here; the job goes on" in named and "rank 1" in named, named
    assert err.index("hang: no progress from rank(s)") < err.index("Root cause:"), err


def test_a_hung_ranks_round_fails_at_the_watchs_deadline_not_at_the_next_tick(
    tmp_path: Path,
) -> None:
    """One node, a tick every 10 minutes. The ticks of a round's start come quickly and each
    doubles the wait to the next (0.1 s, 0.2 s, ... up to the interval): stack requests to
    the launcher, each answered by a tick, take it to the 10 minutes before rank 1 hangs.
    From then on only the watch's own moments wake the agent: when a rank's silence reaches
    its bound (named) and ten times it (failed). Waiting for the tick instead, the job runs
    into the test's timeout, which only catches that."""
    go, logs = tmp_path / "go", tmp_path / "logs"
    args = ["--nproc-per-node", "2", "--max-restarts", "0", *PACE, "--log-dir", str(logs),
            worker("steps_until_go_then_hang.py"), str(go), "1"]  # fmt: skip
    with launched(args) as agent:
        wait_for(lambda: any(logs.glob("*/attempt_0/rank_1")), 60, "the round's start")
        (run_dir,) = logs.iterdir()
        for asked in range(1, TICKS_TO_THE_INTERVAL + 1):
            os.kill(agent.pid, STACK_SIGNAL)
            wait_for(lambda n=asked: len(list(run_dir.glob("stacks_*.txt"))) == n, 60, "stacks")
        go.touch()
        _, err = agent.communicate(timeout=120)
    assert agent.returncode == 1, err
    assert "hang: no progress from rank(s)" in err
    assert "Root cause: rank 1 (local rank 1) on" in err, err
    hang = json.loads((run_dir / "attempt_0" / "hang_report.json").read_text())
    assert [s["rank"] for s in hang["suspects"]] == [1], hang


def test_on_several_nodes_too(hosts: object, nodes: list[Node], tmp_path: Path) -> None:
    """Two nodes, one rank each, the same pace: the node whose rank sleeps (or the other,
    whose rank waits for it) fails the round at its deadline and the job ends as a hang."""
    net = hosts(2)  # type: ignore[operator]
    port = free_port()
    for i in (0, 1):
        args = [*c10d_args(net, port, "2"), "--max-restarts", "0", *PACE,
                SCRIPT, "20", "1"]  # fmt: skip
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    codes = [node.finish(timeout=120) for node in nodes]
    assert codes == [1, 1], [node.stderr[-2000:] for node in nodes]
    assert any("[hang]" in node.stderr for node in nodes), [n.stderr[-2000:] for n in nodes]
