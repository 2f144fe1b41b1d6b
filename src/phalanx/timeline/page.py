"""The timeline as one self-contained HTML page: inline CSS and SVG, no script, nothing
fetched when it is viewed (no CDN, no web fonts), so it opens from a file on an air-gapped
machine. Hovering a mark shows its details (SVG ``<title>``, which needs no script).

Every mark carries a stable hook for tools and tests: ``class="lane" data-rank=R``,
``class="attempt" data-outcome=...``, ``class="wait"``, ``class="failure" data-kind=K``,
``class="hang"``, ``class="restart"``. Every text that comes from the events is escaped.
"""

from __future__ import annotations

import math
import time
from html import escape

from phalanx.timeline.model import Attempt, Mark, Timeline

LABEL_W = 190  # the left column: node and rank labels
CHART_W = 940
GROUP_H = 22  # a node's heading row
BAND_H = 16  # a node's rendezvous band
LANE_H = 30
AXIS_H = 34

# One colour per meaning; the failure mark's is used by nothing else.
COLOURS = {
    "succeeded": "#59a14f",
    "failed": "#e8a3a3",
    "stopped": "#a0a0a0",
    "running": "#4e79a7",
    "wait": "#f2c14e",
    "failure": "#d62728",
    "hang": "#ff7f0e",
    "straggler": "#b07aa1",
    "restart": "#7b3fb5",
    "progress": "#1b3a1b",
    "starting": "#cfd8e3",
}

CSS = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 16px; margin: 0 0 4px; }
p.summary { margin: 0 0 8px; color: #444; }
svg text { font: 11px system-ui, sans-serif; fill: #222; }
svg text.group { font-weight: 600; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  vertical-align: -2px; }
"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


class _Scale:
    def __init__(self, start: float, end: float) -> None:
        self.start = start
        self.span = max(end - start, 1e-3)

    def x(self, t: float) -> float:
        return round(LABEL_W + (t - self.start) / self.span * CHART_W, 1)


def render(timeline: Timeline) -> str:
    """The page for ``timeline``."""
    body = _svg(timeline)
    title = f"phalanx timeline: {timeline.run_id or 'run'}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f'<h1>{_e(title)}</h1><p class="summary">{_e(_headline(timeline))}</p>'
        f"{_legend()}{body}</body></html>\n"
    )


def _headline(tl: Timeline) -> str:
    outcome = tl.outcome or "no end recorded (running, or the agent was killed)"
    code = f" (exit {tl.exit_code})" if tl.exit_code is not None else ""
    began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(tl.start))
    return (
        f"{outcome}{code}; started {began}, {tl.end - tl.start:.1f} s; "
        f"{len(tl.ranks)} ranks on {len(tl.groups)} node(s); "
        f"{len(tl.failures)} failure(s), {len(tl.restarts)} restart(s), {len(tl.hangs)} hang(s)"
    )


def _legend() -> str:
    items = [
        ("succeeded", "succeeded"), ("failed", "failed"), ("stopped", "stopped by phalanx"),
        ("running", "running"), ("starting", "starting"), ("wait", "rendezvous"),
        ("failure", "failure"), ("hang", "hang"), ("straggler", "straggler"),
        ("restart", "restart"),
    ]  # fmt: skip
    spans = "".join(
        f'<span><i style="background:{COLOURS[k]}"></i>{_e(t)}</span>' for k, t in items
    )
    return f'<p class="legend">{spans} <span>line in a bar: the step</span></p>'


def _svg(tl: Timeline) -> str:
    scale = _Scale(tl.start, tl.end)
    parts: list[str] = []
    y = 0
    lanes: dict[int, int] = {}  # rank -> lane top
    bands: dict[tuple[int | None, str], int] = {}
    for group in tl.groups:
        parts.append(f'<text class="group" x="4" y="{y + 15}">{_e(group.label)}</text>')
        y += GROUP_H
        bands[(group.node, group.host)] = y
        parts.append(f'<text x="14" y="{y + 12}">rendezvous</text>')
        y += BAND_H
        for rank in group.ranks:
            lanes[rank] = y
            parts.append(
                f'<g class="lane" data-rank="{rank}" data-host="{_e(group.host)}">'
                f'<rect x="{LABEL_W}" y="{y}" width="{CHART_W}" height="{LANE_H}" fill="#f4f4f4"/>'
                f'<text x="14" y="{y + 19}">rank {rank}</text></g>'
            )
            y += LANE_H
    max_step = max((s for a in tl.attempts for _, s in a.steps), default=0)
    parts += [_attempt(a, lanes[a.rank], scale, max_step) for a in tl.attempts if a.rank in lanes]
    for wait in tl.waits:
        top = bands.get(wait.group, next(iter(bands.values()), 0))
        parts.append(_wait(wait.start, wait.end, wait.round, wait.num_nodes, top, scale))
    parts += [_restart(r.t, r.restart, r.max_restarts, y, scale) for r in tl.restarts]
    parts += [_mark(m, lanes, bands, scale, "failure") for m in tl.failures]
    parts += [_mark(m, lanes, bands, scale, "hang") for m in tl.hangs]
    parts += [_mark(m, lanes, bands, scale, "straggler") for m in tl.stragglers]
    parts.append(_axis(tl, y, scale))
    height = y + AXIS_H
    return (
        f'<svg width="{LABEL_W + CHART_W + 20}" height="{height}" role="img">{"".join(parts)}</svg>'
    )


def _attempt(a: Attempt, top: int, scale: _Scale, max_step: int) -> str:
    x0, x1 = scale.x(a.start), scale.x(a.end)
    steps = f"steps {a.steps[0][1]}..{a.steps[-1][1]}" if a.steps else "no step reported"
    code = f", exit {a.returncode}" if a.returncode is not None else ""
    tip = (
        f"rank {a.rank}, attempt {a.attempt} (round {a.round}): {a.outcome}{code}; "
        f"{a.end - a.start:.1f} s, {steps}; pid {a.pid}"
    )
    bar = (
        f'<rect x="{x0}" y="{top + 4}" width="{max(x1 - x0, 1.0)}" height="{LANE_H - 8}" '
        f'fill="{COLOURS[a.outcome]}" rx="2"/>'
    )
    line = ""
    if a.formed is not None and a.formed < a.start:  # the round formed, the workers start
        s0 = scale.x(a.formed)
        line += (
            f'<rect class="starting" x="{s0}" y="{top + 9}" width="{max(x0 - s0, 1.0)}" '
            f'height="{LANE_H - 18}" fill="{COLOURS["starting"]}"><title>starting: '
            f"{a.start - a.formed:.1f} s from the round formed to the workers running"
            "</title></rect>"
        )
    if a.steps and max_step > 0:
        bottom, high = top + LANE_H - 6, LANE_H - 12
        points = [(x0, bottom)] + [
            (scale.x(t), round(bottom - step / max_step * high, 1)) for t, step in a.steps
        ]
        coords = " ".join(f"{x},{y}" for x, y in points)
        line += (
            f'<polyline class="progress" points="{coords}" fill="none" '
            f'stroke="{COLOURS["progress"]}" stroke-width="1.5"/>'
        )
    if a.steps and x1 - x0 > 70:  # room for the last step's number
        # At the bar's end, but a failed bar's end holds the failure's mark.
        at = f'x="{x0 + 4}"' if a.outcome == "failed" else f'x="{x1 - 4}" text-anchor="end"'
        line += f'<text {at} y="{top + 15}">step {a.steps[-1][1]}</text>'
    return (
        f'<g class="attempt" data-rank="{a.rank}" data-attempt="{a.attempt}" '
        f'data-outcome="{_e(a.outcome)}"><title>{_e(tip)}</title>{bar}{line}</g>'
    )


def _wait(
    start: float, end: float, round_: int | None, nodes: int | None, top: int, scale: _Scale
) -> str:
    x0, x1 = scale.x(start), scale.x(end)
    what = f"round {round_} formed with {nodes} node(s)" if round_ is not None else "no round"
    tip = f"rendezvous wait {end - start:.2f} s: {what}"
    return (
        f'<g class="wait" data-round="{_e(round_)}"><title>{_e(tip)}</title>'
        f'<rect x="{x0}" y="{top + 3}" width="{max(x1 - x0, 2.0)}" height="{BAND_H - 6}" '
        f'fill="{COLOURS["wait"]}"/></g>'
    )


def _restart(t: float, number: int, budget: int | None, bottom: int, scale: _Scale) -> str:
    x = scale.x(t)
    tip = f"restart {number} of {budget}"
    return (
        f'<g class="restart" data-restart="{number}"><title>{_e(tip)}</title>'
        f'<line x1="{x}" y1="0" x2="{x}" y2="{bottom}" stroke="{COLOURS["restart"]}" '
        f'stroke-width="2" stroke-dasharray="5,3"/>'
        f'<text x="{x + 3}" y="{bottom + 26}" fill="{COLOURS["restart"]}">{_e(tip)}</text></g>'
    )


def _mark(
    mark: Mark,
    lanes: dict[int, int],
    bands: dict[tuple[int | None, str], int],
    scale: _Scale,
    cls: str,
) -> str:
    """A failure: a diamond with its kind beside it; a hang: a triangle."""
    x = scale.x(mark.t)
    if mark.rank is not None and mark.rank in lanes:
        cy = lanes[mark.rank] + LANE_H / 2
    else:
        cy = bands.get(mark.group, next(iter(bands.values()), 0)) + BAND_H / 2
    r = 8
    if cls == "failure":
        shape = f'<polygon points="{x},{cy - r} {x + r},{cy} {x},{cy + r} {x - r},{cy}"'
    else:
        shape = f'<polygon points="{x},{cy - r} {x + r},{cy + r} {x - r},{cy + r}"'
    rank = f' data-rank="{mark.rank}"' if mark.rank is not None else ""
    return (
        f'<g class="{cls}" data-kind="{_e(mark.kind)}"{rank}><title>{_e(mark.detail)}</title>'
        f'{shape} fill="{COLOURS[cls]}" stroke="#fff" stroke-width="1"/>'
        f'<text x="{x + r + 3}" y="{cy + 4}" fill="{COLOURS[cls]}" stroke="#fff" '
        f'stroke-width="3" paint-order="stroke">{_e(mark.kind)}</text></g>'
    )


def _axis(tl: Timeline, bottom: int, scale: _Scale) -> str:
    span = max(tl.end - tl.start, 1e-3)
    step = _nice_step(span / 8)
    ticks = []
    for i in range(int(span / step) + 1):
        x = scale.x(tl.start + i * step)
        ticks.append(
            f'<line x1="{x}" y1="{bottom}" x2="{x}" y2="{bottom + 4}" stroke="#666"/>'
            f'<text x="{x}" y="{bottom + 15}" text-anchor="middle">{i * step:g} s</text>'
        )
    return (
        f'<g class="axis"><line x1="{LABEL_W}" y1="{bottom}" x2="{LABEL_W + CHART_W}" '
        f'y2="{bottom}" stroke="#666"/>{"".join(ticks)}</g>'
    )


def _nice_step(raw: float) -> float:
    """1, 2 or 5 times a power of ten, at least ``raw``."""
    power = 10.0 ** math.floor(math.log10(raw))
    return float(next(m * power for m in (1, 2, 5, 10) if m * power >= raw))
