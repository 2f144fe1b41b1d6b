"""What ``phalanx status`` shows: a run's nodes and ranks, from its run directory.

A running job is asked (``ask``: a request file its agent answers, with every node's status
gathered through the store); a finished one is read from its files: ``status.json`` (its
final state), the other nodes' copies from the last request, ``report.json``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.config import shown_run_id
from phalanx.events.figures import Recovery, recovery
from phalanx.events.log import EVENTS_FILE, read_events
from phalanx.events.run import NODES_DIR, read_run_events
from phalanx.report.recovery import ettr_line, summary_lines
from phalanx.status import files
from phalanx.status.launcher import Launcher, read_launcher
from phalanx.status.node import NodeStatus


@dataclass
class RunView:
    run_dir: Path
    state: str  # running, or the job's outcome: succeeded, failed, interrupted; or "ended"
    alive: bool
    own: dict[str, Any]  # this node's status (``NodeStatus.snapshot``)
    nodes: list[dict[str, Any]]  # every node's known status, this one's included, by node rank
    missing: list[dict[str, Any]] = field(default_factory=list)  # asked, did not answer
    note: str = ""  # why the view may be partial
    report: dict[str, Any] | None = None
    recovery: Recovery | None = None  # the figures of every node's events known here

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "state": self.state,
            "alive": self.alive,
            "this_node": self.own.get("node"),
            "nodes": self.nodes,
            "missing": self.missing,
            "note": self.note or None,
            "report": self.report,
            "recovery": self.recovery.to_json() if self.recovery is not None else None,
        }


def is_run_dir(run_dir: Path) -> bool:
    return (run_dir / "launcher.json").is_file() or (run_dir / EVENTS_FILE).is_file()


def ask(run_dir: Path, timeout: float) -> dict[str, Any] | None:
    """Ask the running agent of ``run_dir`` for every node's status; its answer, or None
    when none came within ``timeout`` (the agent is between rounds, or stuck)."""
    nonce = files.new_request(run_dir)
    answer = files.answer_path(run_dir, nonce)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            reply = files.read_json(answer)
            if reply is not None:
                return reply
            time.sleep(0.1)
        return None
    finally:
        for path in (files.request_path(run_dir, nonce), answer):
            with contextlib.suppress(OSError):
                path.unlink()


def gather(run_dir: Path, timeout: float, *, ask_agent: bool = True) -> RunView:
    """The view of ``run_dir``: its running agent asked for every node's status (at most
    ``timeout`` seconds), unless ``ask_agent`` is False (then its files only)."""
    agent = read_launcher(run_dir)
    alive = agent is not None and agent.alive()
    own = files.read_json(run_dir / files.STATUS_FILE) or _from_events(run_dir)
    reply, note = None, ""
    if alive and ask_agent:
        try:
            reply = ask(run_dir, timeout)
        except OSError as exc:
            note = f"cannot ask the agent ({exc.strerror or exc}); its last file"
        else:
            if reply is None:
                note = f"the agent did not answer within {timeout:g} s (between rounds?); its last file"
    if reply is not None and isinstance(reply.get("self"), dict):
        own = reply["self"]
    if agent is not None and not agent.here:
        note = f"the agent runs on {agent.host}; showing the files here"
    others = _other_nodes(run_dir, own, reply)
    nodes = sorted([own, *others], key=lambda n: (n.get("node") is None, n.get("node") or 0))
    missing = list(reply.get("missing") or []) if reply is not None else []
    view = RunView(run_dir, _state(own, alive, agent), alive, own, nodes, missing, note)
    view.report = files.read_json(run_dir / "report.json")
    # ``now`` on this host's monotonic clock, for this host's nodes only (``recovery``).
    now = time.monotonic() if alive else None
    view.recovery = recovery(read_run_events(run_dir), now, socket.gethostname())
    return view


def _other_nodes(
    run_dir: Path, own: dict[str, Any], reply: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The other nodes' statuses: those that answered ``reply``; without a reply (a finished
    run), every copy there is, as of the last request (marked ``stale``)."""
    nodes_dir = run_dir / NODES_DIR
    if reply is not None:
        ranks = [r for r in reply.get("answered") or [] if isinstance(r, int)]
    elif nodes_dir.is_dir():
        ranks = sorted(int(p.name) for p in nodes_dir.iterdir() if p.name.isdigit())
    else:
        ranks = []
    found = []
    for rank in ranks:
        status = files.read_json(files.node_dir(run_dir, rank) / files.STATUS_FILE)
        if status is None or (status.get("node") == own.get("node") and reply is None):
            continue
        if reply is None:
            status["stale"] = True  # as it answered the last request, not now
        found.append(status)
    return found


def _from_events(run_dir: Path) -> dict[str, Any]:
    """A status rebuilt from ``events.jsonl`` (an agent too old or too quick to write one)."""
    node = NodeStatus()  # the agent's own builder, replayed
    with contextlib.suppress(OSError):
        for record in read_events(run_dir / EVENTS_FILE):
            node.hear(record)
    return node.snapshot()


def _state(own: dict[str, Any], alive: bool, agent: Launcher | None) -> str:
    outcome = own.get("outcome")
    if isinstance(outcome, str):
        return outcome
    if alive or (agent is not None and not agent.here):
        return str(own.get("state") or "running")
    return "ended"  # no job_end: the agent was killed (SIGKILL) or its host went down


def render(view: RunView, now: float | None = None) -> str:
    now = time.time() if now is None else now
    lines = [_headline(view, view.own, now)]
    spares = view.own.get("spares")
    if isinstance(spares, int) and spares > 0 and view.alive:
        lines.append(
            f"{spares} spare{'s' if spares > 1 else ''} waiting (agents beyond --nnodes MAX, "
            "each ready to take a lost or excluded member's place)"
        )
    if view.note:
        lines.append(f"note: {view.note}")
    rows = [["NODE", "HOST", "STATE", "RANK", "LOCAL", "PID", "RANK STATE", "STEP", "STEPS/S",
             "LAST BEAT"]]  # fmt: skip
    for node in view.nodes:
        prefix = [
            _text(node.get("node")),
            _text(node.get("host")),
            _text(node.get("state")) + _as_of(node),
        ]
        for rank in node.get("ranks") or [{}]:
            cells = _rank_cells(rank)
            if node.get("stale"):
                cells[-1] = "-"  # a beat long ago, not "0 s ago"
            rows.append([*prefix, *cells])
    lines += _table(rows)
    if any(row[7].endswith(COUNTED) for row in rows[1:]):
        lines.append(
            f"{COUNTED} optimizer steps (and phalanx.heartbeat() calls) counted by phalanx: "
            "the script reports no step (phalanx.step(n) would)"
        )
    if view.missing:
        names = ", ".join(f"node {m.get('node')} ({m.get('host')})" for m in view.missing)
        lines.append(f"no answer from: {names}")
    lines += [str(line) for line in view.own.get("node_check") or ()]  # the same on every node
    lines += [str(line) for line in view.own.get("stragglers") or ()]  # the same on every node
    lines += _failures(view)
    figures = view.recovery
    if figures is not None:
        ettr = [ettr_line(figures, node) for node in figures.nodes if node.ettr is not None]
        lines += summary_lines(figures) if figures.recovering else ettr
    return "\n".join(lines) + "\n"


def _headline(view: RunView, head: dict[str, Any], now: float) -> str:
    restarts = f"restarts {_text(head.get('restarts'))}"
    if head.get("max_restarts") is not None:
        restarts += f" of {head['max_restarts']}"
    started = head.get("started_at")
    when = ""
    if isinstance(started, (int, float)):
        end = head.get("ended_at")
        span = (end if isinstance(end, (int, float)) else now) - started
        when = f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}"
        when += f" ({_duration(span)}{'' if view.alive else ' in all'})"
    code = f" (exit code {head['exit_code']})" if head.get("exit_code") is not None else ""
    return (
        f"run {_run_id(head)}: {view.state}{code}; round {_text(head.get('round'))}, "
        f"{restarts}, {_text(head.get('num_nodes'))} node(s), world size "
        f"{_text(head.get('world_size'))}{when}"
    )


def _run_id(head: dict[str, Any]) -> str:
    run_id = head.get("run_id")
    return shown_run_id(run_id, quote=False) if isinstance(run_id, str) else "-"


def _as_of(node: dict[str, Any]) -> str:
    """For a copy from an earlier request: when it was true."""
    when = node.get("updated_at")
    if not node.get("stale") or not isinstance(when, (int, float)):
        return ""
    return f" (as of {time.strftime('%H:%M:%S', time.localtime(when))})"


def _rank_cells(rank: dict[str, Any]) -> list[str]:
    if not rank:
        return ["-"] * 7
    rate = rank.get("steps_per_s")
    since = rank.get("since_beat")
    state = _text(rank.get("state"))
    if rank.get("state") == "running" and rank.get("hung"):
        state = "hung"  # named by the hang watch, not moved since
    if rank.get("state") != "running" and rank.get("returncode") is not None:
        state += f" ({rank['signal'] or rank['returncode']})"
    return [
        _text(rank.get("rank")),
        _text(rank.get("local_rank")),
        _text(rank.get("pid")),
        state,
        _step(rank),
        f"{rate:.2f}" if isinstance(rate, (int, float)) else "-",
        f"{since:g} s ago" if isinstance(since, (int, float)) else "-",
    ]


COUNTED = "*"  # a STEP cell that shows the optimizer steps phalanx counted (no phalanx.step)


def _step(rank: dict[str, Any]) -> str:
    """The rank's step (``phalanx.step``), else the optimizer steps (and heartbeats) phalanx
    counted for it, marked: a plain DDP script reports no step but its optimizer steps."""
    step, beats = rank.get("step"), rank.get("beats")
    if step is None and isinstance(beats, int) and beats > 0:
        return f"{beats}{COUNTED}"
    return _text(step)


def _failures(view: RunView) -> list[str]:
    lines = []
    known = [n["last_failure"] for n in view.nodes if isinstance(n.get("last_failure"), dict)]
    last = max(known, key=lambda f: f.get("t") or 0.0, default=None)
    if last:
        where = f"rank {last.get('rank')}" if last.get("rank") is not None else "a node"
        if last.get("failed_node") is not None:
            where += f" (node {last['failed_node']})"
        kind = f" [{last['failure_kind']}]" if last.get("failure_kind") else ""
        lines.append(
            f"last failure: round {_text(last.get('round'))}, {where}{kind}: "
            f"{last.get('reason') or '-'}"
        )
    cause = (view.report or {}).get("root_cause")
    if isinstance(cause, dict):
        kind = f" [{cause['kind']}]" if cause.get("kind") else ""
        lines.append(
            f"root cause: rank {_text(cause.get('rank'))} on {_text(cause.get('host'))}{kind}: "
            f"{cause.get('reason') or _exit(cause)}"
        )
    elif view.report and view.report.get("reason"):
        lines.append(f"report: {view.report['reason']}")
    return lines


def _exit(cause: dict[str, Any]) -> str:
    code = cause.get("returncode")
    return f"exit code {code}" if isinstance(code, int) and code >= 0 else f"killed ({code})"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def dumps(view: RunView) -> str:
    return json.dumps(view.to_json(), indent=2)
