"""What ``soak.py`` reports: the reference run, the invariants, the figures, the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from phalanx.events.figures import recovery
from phalanx.events.run import read_run_events

HERE = Path(__file__).resolve().parent


def reference(out: Path) -> Path:
    """The same trainer, config and world size (2), uninterrupted, without the step delay."""
    ref = out / "reference"
    argv = [sys.executable, "-m", "phalanx", "--standalone", "--nproc-per-node", "2", "--log-dir",
            str(out / "reference-logs"), str(HERE / "soak_trainer.py"), "--config",
            str(out / "config.json"), "--output_dir", str(ref)]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, timeout=1800)
    return ref / "final.pt"


def same_weights(a: Path, b: Path) -> bool:
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def checkpoints_loadable(folder: Path) -> tuple[int, list[str]]:
    bad, count = [], 0
    for path in sorted(folder.glob("*.pt")):
        count += 1
        try:
            torch.load(path, weights_only=True)
        except Exception as exc:
            bad.append(f"{path.name}: {exc}")
    return count, bad


def event_figures(logs: list[Path]) -> dict[str, Any]:
    runs = [run for folder in logs if folder.is_dir() for run in folder.iterdir() if run.is_dir()]
    incidents, ettrs = [], []
    for run in runs:
        try:
            rec = recovery(read_run_events(run))
        except OSError:
            continue
        incidents += [i.to_json() for i in rec.incidents]
        if rec.ettr is not None:
            ettrs.append(
                {"run": run.name, "ettr": rec.ettr, "nodes": [n.to_json() for n in rec.nodes]}
            )
    return {"runs": [str(r) for r in runs], "incidents": incidents, "ettr_by_run": ettrs}


def per_fault(faults: list[dict[str, Any]], incidents: list[dict[str, Any]]) -> None:
    """Each fault gets the first incident recorded from its injection on (until the next)."""
    for i, fault in enumerate(faults):
        end = faults[i + 1]["at"] if i + 1 < len(faults) else float("inf")
        hits = sorted((x for x in incidents if fault["at"] - 1 <= x["failed_at"] < end),
                      key=lambda x: x["failed_at"])  # fmt: skip
        if hits:
            x = hits[0]
            fault.update(detect=x["detect"], stop=x["stop"], reform=x["reform"], back=x["back"],
                         downtime=max(h["downtime"] for h in hits), seen_as=x["failure_kind"])  # fmt: skip


def table(faults: list[dict[str, Any]]) -> str:
    def f(v: object) -> str:
        return f"{v:6.2f}" if isinstance(v, float) else f"{'-':>6}"

    rows = [f"{'#':>2} {'t(s)':>6} {'kind':<17} {'where':>5} {'detect':>6} {'stop':>6} {'reform':>6} "
            f"{'back':>6} {'down':>6}  seen as"]  # fmt: skip
    t0 = faults[0]["at"] if faults else 0
    for i, x in enumerate(faults):
        where = x.get("node", x.get("member", ""))
        rows.append(f"{i + 1:>2} {x['at'] - t0:6.1f} {x['kind']:<17} {where!s:>5} {f(x.get('detect'))} "
                    f"{f(x.get('stop'))} {f(x.get('reform'))} {f(x.get('back'))} {f(x.get('downtime'))}  "
                    f"{x.get('seen_as') or x.get('skipped') or ''}")  # fmt: skip
    return "\n".join(rows)


def write(out: Path, report: dict[str, Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
