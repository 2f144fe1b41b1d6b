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


def reference(out: Path, world: int = 2, resumes: list[int] | None = None) -> Path:
    """The same trainer, config and world size, uninterrupted, without the step delay. With
    ``resumes`` (the steps the job resumed from), resumed from the same steps: at a world of 3
    the trainer itself is not bit-identical across a resume (DDP's first step after a resume
    reduces its gradients in buckets of another layout, and a sum of three floats depends on
    its order; of two it does not), so the job is compared with the same resumes, each one
    stop and start of an otherwise uninterrupted run."""
    ref = out / "reference"
    cfg = json.loads((out / "config.json").read_text())
    for i, steps in enumerate([*sorted(set(resumes or [])), cfg["steps"]]):
        config = out / f"reference-config-{i}.json"
        config.write_text(json.dumps({**cfg, "steps": steps}))
        argv = [sys.executable, "-m", "phalanx", "--standalone", "--nproc-per-node", str(world),
                "--log-dir", str(out / "reference-logs"), str(HERE / "soak_trainer.py"),
                "--config", str(config), "--output_dir", str(ref)]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True, timeout=1800)
    return ref / "final.pt"


def resumed_from(logs: list[Path]) -> list[int]:
    """The steps the job resumed from, as its first rank said each time (every node's runs)."""
    found = []
    for folder in logs:
        for out in folder.glob("*/attempt_*/rank_*/stdout.log") if folder.is_dir() else []:
            for line in out.read_text(errors="replace").splitlines():
                if "; resumed from step " in line:
                    found.append(int(line.rsplit(" ", 1)[1]))
    return found


def rerun_steps(logs: list[Path], steps: Path) -> dict[str, Any]:
    """Per restart, the steps run again: the highest step a worker of the round before had
    completed (``soak_trainer``'s ``$SOAK_STEPS`` files, by restart count) against the step
    the restarted round resumed from (its first rank's "resumed from step N"; "starting at
    step 0" is 0). Counted in steps, not seconds: a loaded machine does not change them."""
    reached: dict[int, int] = {}
    for path in steps.iterdir() if steps.is_dir() else ():
        try:
            restart, value = int(path.name.split(".", 1)[0]), int(path.read_text())
        except ValueError:
            continue  # a worker killed before its first step wrote nothing
        reached[restart] = max(reached.get(restart, 0), value)
    resumed: dict[int, int] = {}
    for folder in logs:
        for out in folder.glob("*/attempt_*/rank_*/stdout.log") if folder.is_dir() else []:
            restart = int(out.parent.parent.name.removeprefix("attempt_"))
            for line in out.read_text(errors="replace").splitlines():
                if "; resumed from step " in line:
                    resumed[restart] = int(line.rsplit(" ", 1)[1])
                elif "; starting at step 0" in line:
                    resumed[restart] = 0
    per = [{"restart": k, "reached": reached[k - 1], "resumed": s, "rerun": reached[k - 1] - s}
           for k, s in sorted(resumed.items()) if k > 0 and k - 1 in reached]  # fmt: skip
    return {"per_restart": per, "total": sum(p["rerun"] for p in per)}


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


def table(faults: list[dict[str, Any]]) -> str:
    def f(v: object) -> str:
        return f"{v:6.2f}" if isinstance(v, float) else f"{'-':>6}"

    rows = [f"{'#':>2} {'t(s)':>6} {'kind':<17} {'where':>5} {'detect':>6} {'stop':>6} {'kill':>6} "
            f"{'reform':>6} {'back':>6} {'down':>6}  seen as"]  # fmt: skip
    t0 = faults[0]["at"] if faults else 0
    for i, x in enumerate(faults):
        where = x.get("node", x.get("member", ""))
        rows.append(f"{i + 1:>2} {x['at'] - t0:6.1f} {x['kind']:<17} {where!s:>5} {f(x.get('detect'))} "
                    f"{f(x.get('stop'))} {f(x.get('kill'))} {f(x.get('reform'))} {f(x.get('back'))} "
                    f"{f(x.get('downtime'))}  "
                    f"{x.get('seen_as') or x.get('skipped') or ''}")  # fmt: skip
    return "\n".join(rows)


def write(out: Path, report: dict[str, Any]) -> None:
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))


def read_events(logs: list[Path]) -> list[dict[str, Any]]:
    """Every event of every agent run under ``logs`` (a line cut short by a full disk or a
    SIGKILL is skipped). All agents share the host's clock, so ``t`` compares across them
    and with the harness's ``time.time()``."""
    found = []
    for folder in logs:
        for path in folder.glob("*/events.jsonl") if folder.is_dir() else ():
            for line in path.read_text(errors="replace").splitlines():
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
    return sorted(found, key=lambda e: float(e.get("t", 0)))


def read_marks(folder: Path) -> list[tuple[float, str]]:
    """(time, "node.rank") of every worker process's first step (``soak_trainer``)."""
    found = []
    for path in folder.iterdir() if folder.is_dir() else ():
        try:
            found.append((float(path.read_text()), path.name.rsplit(".", 1)[0]))
        except ValueError:
            continue  # a worker killed while writing it
    return sorted(found)


def job_per_fault(
    faults: list[dict[str, Any]],
    events: list[dict[str, Any]],
    marks: list[tuple[float, str]] | None = None,
) -> None:
    """Each fault's figures for the job, from every agent's events (not one agent run's: a
    member pushed out of the next round by the spare waits as the new spare, and its own
    "next round" comes only with a later fault). From the injection (the harness's clock):
    ``detect`` to the first ``failure`` event; ``stop`` to the last ``stopped`` of that round
    (every node's workers gone: for a node cut off or frozen, the others' wait to find it
    lost, ``heartbeat_timeout``, after its own fence); ``kill`` (not a part of the sum) the
    longest any node of the round took from its decision to stop to its workers gone (its
    ``stopped`` event's ``seconds``: the SIGTERM grace, where a worker outlives it);
    ``reform`` to the last ``rdzv_done`` of the next round (every member knows it); ``back``
    until every rank of it made its first step (``marks``, the workers' own; without them
    the round's first ``progress``, sampled every 2 s, so up to 2 s late); ``down`` the sum,
    from the injection to back."""
    for i, fault in enumerate(faults):
        if "skipped" in fault:
            continue
        end = faults[i + 1]["at"] if i + 1 < len(faults) else float("inf")
        within = [e for e in events if fault["at"] - 1 <= e["t"] < end]
        failures = [e for e in within if e["kind"] == "failure"]
        if not failures:
            continue
        first = failures[0]
        r, detected = first.get("round"), first["t"]
        later = [e for e in within if e["kind"] == "rdzv_done" and e.get("round", -1) > r]
        # (a node frozen or cut off records its own stop once it is back: after the others
        # re-formed without it, so not a part of the job's way back)
        formed_first = later[0]["t"] if later else float("inf")
        ended = [e for e in within
                 if e["kind"] == "stopped" and e.get("round") == r and e["t"] <= formed_first]  # fmt: skip
        stopped = max((e["t"] for e in ended), default=detected)
        fig: dict[str, Any] = {"seen_as": first.get("failure_kind"), "round": r,
                               "detect": max(0.0, detected - fault["at"]), "stop": stopped - detected,
                               "kill": max((float(e.get("seconds", 0)) for e in ended), default=0.0)}  # fmt: skip
        if later:
            r2 = min(e["round"] for e in later)
            formed = max(e["t"] for e in later if e["round"] == r2)
            fig["reform"] = formed - stopped
            back = _back_at(within, r2, formed, end, marks)
            if back is not None:
                fig["back"] = back - formed
                fig["downtime"] = back - fault["at"]
        fig.setdefault("downtime", min(end, within[-1]["t"]) - fault["at"])
        fault.update(fig)


def _back_at(
    within: list[dict[str, Any]],
    r: int,
    formed: float,
    end: float,
    marks: list[tuple[float, str]] | None,
) -> float | None:
    """When every rank of round ``r`` (formed at ``formed``) had made its first step."""
    if marks:
        ranks = {
            e.get("world_size", 0)
            for e in within
            if e["kind"] == "rdzv_done" and e.get("round") == r
        }
        # The round's own workers' marks: the first ``world`` after it formed (a later round's
        # workers mark too, and the last fault's window has no end)
        world = max(ranks, default=1)
        firsts = sorted(t for t, _ in marks if formed <= t < end)[:world]
        if firsts and len(firsts) >= world:
            return firsts[-1]
    back = [e["t"] for e in within if e["kind"] == "progress" and e.get("round") == r]
    return min(back) if back else None


def step_seconds(logs: list[Path], global_batch: int) -> float | None:
    """The job's own step time when nothing fails: the median over the trainer's log lines
    ("step N/M loss L R samples/s", each over ``log_every`` steps, checkpoint saves included)."""
    rates = []
    for folder in logs:
        for path in folder.glob("*/attempt_*/rank_*/stdout.log") if folder.is_dir() else ():
            for line in path.read_text(errors="replace").splitlines():
                words = line.split()
                if len(words) >= 6 and words[0] == "step" and words[-1] == "samples/s":
                    rates.append(float(words[-2]))
    if not rates:
        return None
    rates.sort()
    return global_batch / rates[len(rates) // 2]


def by_kind(faults: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per fault kind: how many, the median and total seconds down."""
    kinds: dict[str, list[float]] = {}
    for f in faults:
        if "skipped" not in f:
            kinds.setdefault(f["kind"], []).append(float(f.get("downtime") or 0.0))
    return {k: {"count": len(v), "median_down": sorted(v)[len(v) // 2], "total_down": sum(v)}
            for k, v in sorted(kinds.items(), key=lambda kv: -sum(kv[1]))}  # fmt: skip


def lost_split(
    faults: list[dict[str, Any]], waits: dict[str, float], wall: float, useful: float
) -> dict[str, float]:
    """Where the run's lost time (``wall - useful``, ``useful`` = steps x the job's own step
    time) went: ``down`` (from each injection to training again), ``waited`` (the part of each
    fault's down that it must wait out by its own nature at the run's settings: ``waits``, by
    kind: a hang's fail point, a silent node's timeout, a frozen spare's hold), ``reaction``
    (the rest of ``down``: phalanx's own detecting, stopping, re-forming and restarting) and
    ``rest`` (not down: steps run again since the last checkpoint, slower first steps)."""
    downs = [(f["kind"], float(f.get("downtime") or 0.0)) for f in faults if "skipped" not in f]
    down = sum(d for _, d in downs)
    waited = sum(min(waits.get(kind, 0.0), d) for kind, d in downs)
    lost = wall - useful
    return {"lost": lost, "down": down, "waited": waited, "reaction": down - waited,
            "rest": lost - down, "ettr_without_waits": useful / (wall - waited)}  # fmt: skip


def agent_lives(history: list[tuple[float, dict[int, dict[str, int]]]]) -> list[dict[str, Any]]:
    """Each active agent (node, generation) seen in at least two samples, with its first and
    last figures and when they were taken (seconds into the run), longest-lived first. An
    agent that began to serve the store (c10d: a successor) is compared from then on."""
    seen: dict[tuple[int, int, int], list[tuple[float, dict[str, int]]]] = {}
    for at, sample in history:
        for node, figures in sample.items():
            key = (int(node), figures["gen"], figures.get("hosts", 0))
            seen.setdefault(key, []).append((at, figures))
    lives = [{"node": node, "gen": gen, "from_s": got[0][0], "to_s": got[-1][0],
              "first": got[0][1], "last": got[-1][1]}
             for (node, gen, _), got in seen.items() if len(got) > 1]  # fmt: skip
    return sorted(lives, key=lambda life: life["from_s"] - life["to_s"])


def grew(first: dict[str, int], last: dict[str, int]) -> bool:
    """An agent's growth over its life: RSS by half, 10 descriptors or 6 threads (a round's
    passing threads and files stay under that; a leak per fault does not, over 20 faults)."""
    return (last["rss"] > 1.5 * first["rss"] or last["fds"] > first["fds"] + 10
            or last["threads"] > first["threads"] + 6)  # fmt: skip
