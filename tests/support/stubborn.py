"""Two c10d agents on loopback where one rank fails and the other ignores its SIGTERM: the
nodes are then between rounds (a failure told, no restart round formed yet) for as long as
the stubborn rank's shutdown grace (``tests/workers/stubborn_then_fail.py``)."""

from __future__ import annotations

from pathlib import Path

from phalanx.resources.ports import free_port
from support.hosts import Loopback, Node
from support.launch import wait_for, worker

HANG = 90.0
# close_timeout: a node whose store is gone for good (its host SIGKILLed or stopped) waits
# that long for it to answer again before its restart round "could not form"; 10 s, not the
# default 30 s each such test waited out (s56: 33 s of the store-host test's 34 s).
FAST = "heartbeat_interval=0.5,heartbeat_timeout=4,last_call_timeout=1,join_timeout=30,close_timeout=10"
FAILED = "exit code 3 (attempt 0)"  # numbered as its directory, attempt_0


def start_between_rounds(
    nodes: list[Node], tmp_path: Path, stubborn: int, shutdown: int, run_id: str
) -> tuple[Node, Node]:
    """Two agents; rank ``stubborn`` ignores SIGTERM (for ``shutdown`` seconds), the other
    rank exits 3. Returns (the node whose worker failed, the other) once the failure was
    told and the other node began to stop its worker."""
    marks = tmp_path / "marks"
    marks.mkdir()
    net, port = Loopback(), free_port()
    args = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--rdzv-conf", FAST,
        "--max-restarts", "3", "--shutdown-timeout", str(shutdown), "--cold-start",
        worker("stubborn_then_fail.py"), str(marks), str(stubborn),
    ]  # fmt: skip
    for i in (0, 1):
        nodes.append(Node(net, i, args, tmp_path, f"n{i}"))
    wait_for(lambda: any(FAILED in n.stderr for n in nodes), HANG, "a worker to fail")
    # The other node heard of it: it is stopping its worker (which ignores the SIGTERM).
    wait_for((marks / "sigterm").exists, HANG, "the other node to stop its worker")
    failed = next(n for n in nodes if FAILED in n.stderr)
    return failed, next(n for n in nodes if n is not failed)
