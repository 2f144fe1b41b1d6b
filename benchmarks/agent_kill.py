"""Where an agent SIGKILL's down time goes, kill by kill (issue 41's first lead).

``sudo python benchmarks/agent_kill.py [--kills 6] [--every 25] [--backend etcd|c10d]`` runs
``soak.py --kinds agent_kill`` (network namespaces, real etcd or c10d, the soak's trainer)
and prints, for each kill, from the agents' event logs and the workers' first-step stamps
(the harness's one clock, seconds from the injection): *detect* (the first ``failure``),
*stop* (the last ``stopped`` of that round), *re-form* (the last ``rdzv_done`` of the next
round), *started* (the last ``workers_started`` of it), *step* (every rank past its first
step), *down* (the sum); and who the next round took: ``new`` for an agent started after the
kill (the soak starts a killed agent again), ``old`` for one that ran before it, with when it
joined (``rdzv_start``; ``waiting``: a spare, there before the kill) and when its own workers
started. ``--from DIR`` reads a soak's ``--out`` instead of running one.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import soak_report as rep  # noqa: E402


def read_events(logs: list[Path]) -> list[dict[str, Any]]:
    """``soak_report.read_events``, each event tagged with its agent run (``src``)."""
    import json

    found = []
    for folder in logs:
        for path in folder.glob("*/events.jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    found.append({**json.loads(line), "src": str(path.parent)})
                except ValueError:
                    continue
    return sorted(found, key=lambda e: float(e.get("t", 0)))


def split(out: Path) -> list[dict[str, Any]]:
    import json

    faults = json.loads((out / "report.json").read_text())["faults"]
    logs = [p for disk in sorted((out / "logs").glob("disk*")) for p in disk.glob("*-logs")]
    events = read_events(logs)
    marks = rep.read_marks(out / "marks")
    rows = []
    for i, fault in enumerate(f for f in faults if "downtime" in f):
        at = fault["at"]
        end = faults[i + 1]["at"] if i + 1 < len(faults) else float("inf")
        within = [e for e in events if at - 1 <= e["t"] < end]
        r2 = fault["round"] + 1
        nxt = [e for e in within if e.get("round", -1) > fault["round"]]
        r2 = min((e["round"] for e in nxt if e["kind"] == "rdzv_done"), default=r2)
        done = [e for e in within if e["kind"] == "rdzv_done" and e.get("round") == r2]
        started = [e for e in within if e["kind"] == "workers_started" and e.get("round") == r2]
        fresh = {e["src"] for e in within if e["kind"] == "run_start" and e["t"] >= at}
        joins = {e["src"]: e["t"] for e in within if e["kind"] == "rdzv_start"}
        who = []
        for e in done:
            pid = e["src"]
            mine = [s["t"] for s in started if s["src"] == pid]
            tag = "new" if pid in fresh else "old"
            join = f"joined {joins[pid] - at:.2f}" if pid in joins else "waiting"
            who.append(f"{tag} ({join}, workers {(mine[0] - at) if mine else float('nan'):.2f})")
        firsts = [t for t, _ in marks if at <= t < end]
        row = {"at": at, "node": fault.get("node"), "detect": fault.get("detect"),
               "stop": fault.get("stop"), "reform": fault.get("reform"),
               "started": max(e["t"] for e in started) - max(e["t"] for e in done)
               if started and done else None,
               "down": fault.get("downtime"), "who": who, "first_steps": len(firsts)}  # fmt: skip
        if row["started"] is not None and fault.get("back") is not None:
            row["step"] = fault["back"] - row["started"]
        rows.append(row)
    return rows


def show(rows: list[dict[str, Any]]) -> str:
    def f(v: object) -> str:
        return f"{v:6.2f}" if isinstance(v, float) else f"{'-':>6}"

    lines = [f"{'#':>2} {'node':>4} {'detect':>6} {'stop':>6} {'reform':>6} {'started':>7} "
             f"{'step':>6} {'down':>6}  next round's members (s from the kill)"]  # fmt: skip
    for i, r in enumerate(rows):
        lines.append(f"{i + 1:>2} {r['node']!s:>4} {f(r['detect'])} {f(r['stop'])} {f(r['reform'])} "
                     f" {f(r['started'])} {f(r.get('step'))} {f(r['down'])}  {', '.join(r['who'])}")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--every", type=float, default=25.0, help="seconds between kills (25)")
    parser.add_argument("--backend", choices=("etcd", "c10d"), default="etcd")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default="", help="the soak's --out (default: a new /tmp dir)")
    parser.add_argument("--from", dest="source", default="", help="read this soak's --out")
    args = parser.parse_args()
    out = Path(args.source or args.out or f"/tmp/phalanx-agent-kill-{args.seed}")
    if not args.source:
        minutes = args.kills * args.every / 60
        subprocess.run([sys.executable, str(HERE / "soak.py"), "--kinds", "agent_kill",
                        "--minutes", f"{minutes:.3f}", "--every", str(args.every),
                        "--seed", str(args.seed), "--backend", args.backend, "--out", str(out)],
                       check=False)  # fmt: skip
    print(show(split(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
