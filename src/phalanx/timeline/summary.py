"""The timeline as a few lines for a terminal (``phalanx timeline RUN_DIR`` without ``-o``)."""

from __future__ import annotations

from phalanx.timeline.model import Attempt, Timeline


def summarize(tl: Timeline) -> str:
    """Attempts (ranks, duration, outcome, last step), failures with kind and rank, hangs,
    restarts and the rendezvous waits, in time order."""
    outcome = tl.outcome or "no end recorded (running, or the agent was killed)"
    code = f", exit {tl.exit_code}" if tl.exit_code is not None else ""
    hosts = ", ".join(g.label for g in tl.groups) or "no workers started"
    lines = [
        f"run {tl.run_id or '?'}: {outcome}{code}, {tl.end - tl.start:.1f} s; "
        f"{len(tl.ranks)} rank(s) on {hosts}"
    ]
    lines += _attempt_lines(tl)
    entries: list[tuple[float, str]] = []
    entries += [(m.t, f"failure  {m.detail}") for m in tl.failures]
    entries += [(m.t, f"hang     {m.detail}") for m in tl.hangs]
    entries += [(m.t, f"slow     {m.detail}") for m in tl.stragglers]
    entries += [(r.t, f"restart  {r.restart} of {r.max_restarts}") for r in tl.restarts]
    lines += [f"  +{t - tl.start:7.2f} s  {text}" for t, text in sorted(entries)]
    waited = sum(w.end - w.start for w in tl.waits)
    lines.append(f"rendezvous: {len(tl.waits)} wait(s), {waited:.2f} s in all")
    lines.append(
        f"{len(tl.failures)} failure(s), {len(tl.restarts)} restart(s), {len(tl.hangs)} hang(s)"
    )
    return "\n".join(lines)


def _attempt_lines(tl: Timeline) -> list[str]:
    by_number: dict[int, list[Attempt]] = {}
    for a in tl.attempts:
        by_number.setdefault(a.attempt, []).append(a)
    lines = []
    for number, ranks in sorted(by_number.items()):
        start = min(a.start for a in ranks)
        end = max(a.end for a in ranks)
        outcomes = ", ".join(
            f"rank {a.rank} {a.outcome}" + (f" at step {a.steps[-1][1]}" if a.steps else "")
            for a in sorted(ranks, key=lambda a: a.rank)
        )
        lines.append(
            f"attempt {number}: +{start - tl.start:.2f} s, {end - start:.2f} s; {outcomes}"
        )
    return lines
