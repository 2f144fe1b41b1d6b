"""``phalanx timeline``: a real job with one failure and one restart drawn as a page that a
real headless Chromium opens (its DOM and a decoded screenshot checked), and summed up on
the terminal; the page's own rules (escaping, nothing fetched) on events written by hand."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from phalanx.events import EVENTS_FILE, read_events
from phalanx.events.figures import recovery
from phalanx.timeline import build, render
from phalanx.timeline.page import COLOURS
from support import browser
from support.launch import PHALANX, run_phalanx, worker

needs_chromium = pytest.mark.skipif(
    browser.CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def failed_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The run directory of a real 2-rank job whose rank 1 exits 3 at step 2 of its first
    attempt; the restart then runs all 6 steps."""
    logs = tmp_path_factory.mktemp("timeline") / "logs"
    done = run_phalanx(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs),
         worker("steps_then_fail.py"), "6", "1", "2"],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (events,) = logs.glob(f"*/{EVENTS_FILE}")
    yield events.parent


def _timeline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PHALANX, "timeline", *args], capture_output=True, text=True, timeout=60)


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def _runs(rows: list[int]) -> list[range]:
    """The runs of consecutive numbers in ``rows`` (sorted), as ranges."""
    runs: list[range] = []
    for row in rows:
        if runs and row == runs[-1].stop:
            runs[-1] = range(runs[-1].start, row + 1)
        else:
            runs.append(range(row, row + 1))
    return runs


@needs_chromium
def test_the_page_in_a_real_browser(failed_once: Path, tmp_path: Path) -> None:
    page = tmp_path / "run.html"
    done = _timeline(str(failed_once), "-o", str(page))
    assert done.returncode == 0, done.stderr
    dom = browser.dump_dom(page)
    lanes = re.findall(r'<g class="lane" data-rank="(\d+)"', dom)
    assert sorted(lanes) == ["0", "1"]
    failures = re.findall(r'<g class="failure" data-kind="([^"]+)" data-rank="(\d+)"', dom)
    assert failures == [("exit_code", "1")]
    outcomes = re.findall(r'class="attempt" data-rank="(\d)" data-attempt="(\d)" '
                          r'data-outcome="(\w+)"', dom)  # fmt: skip
    assert sorted(outcomes) == [
        ("0", "0", "stopped"), ("0", "1", "succeeded"),
        ("1", "0", "failed"), ("1", "1", "succeeded"),
    ]  # fmt: skip
    assert len(re.findall(r'<g class="restart"', dom)) == 1
    assert len(re.findall(r'<g class="wait"', dom)) == 2  # the first round and the restart's
    assert len(re.findall(r'<polyline class="progress"', dom)) == 4  # a step line per bar
    assert "<title>exit_code: rank 1, exit code 3 (attempt 0)" in dom  # the hover's text
    assert re.search(r"<title>rank 1, attempt 0 \(round \d+\): failed, exit 3; [\d.]+ s, "
                     r"steps 0\.\.2; pid \d+</title>", dom)  # fmt: skip
    assert len(re.findall(r'<rect class="starting"', dom)) == 4  # round formed -> running
    # Nothing is fetched when the page is viewed.
    assert re.findall(r'(?:src|href)\s*=\s*["\']?(?:https?:|//)', page.read_text()) == []
    text = page.read_text()
    assert "<script" not in text and "@import" not in text and "url(" not in text

    png = browser.screenshot(page, tmp_path / "run.png", (1200, 600))
    image = Image.open(png).convert("RGB")
    assert image.size == (1200, 600)
    pixels = image.load()
    width, height = image.size

    def rows_with(colour: str, wide: int = 6) -> list[int]:
        """Rows holding ``wide`` pixels of exactly ``colour`` side by side: a shape, not a
        text's anti-aliased fringe."""
        rgb = _rgb(colour)
        rows = []
        for y in range(height):
            run = 0
            for x in range(width):
                run = run + 1 if pixels[x, y] == rgb else 0
                if run >= wide:
                    rows.append(y)
                    break
        return rows

    # The succeeded attempts are bars on two lanes, one under the other (the legend's
    # swatch above them); the failure's diamond, in a colour nothing else uses, is on the
    # lower lane, rank 1's, beside its failed attempt's bar.
    *legend, rank0, rank1 = _runs(rows_with(COLOURS["succeeded"]))
    assert len(legend) == 1 and rank0.stop < rank1.start

    def in_chart(colour: str) -> set[int]:
        return set(rows_with(colour)) - set(legend[0])

    assert len(in_chart(COLOURS["failure"])) >= 4
    assert in_chart(COLOURS["failure"]) <= set(rank1)
    assert in_chart(COLOURS["failed"]) and in_chart(COLOURS["failed"]) <= set(rank1)
    assert in_chart(COLOURS["stopped"]) and in_chart(COLOURS["stopped"]) <= set(rank0)


def test_the_terminal_summary(failed_once: Path) -> None:
    done = _timeline(str(failed_once))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("run ") and ": succeeded, exit 0" in lines[0]
    assert "2 rank(s) on node 0" in lines[0]
    assert lines[1].startswith("attempt 0: ")
    assert "rank 0 stopped at step" in lines[1] and "rank 1 failed at step 2" in lines[1]
    assert lines[2].startswith("attempt 1: ") and "rank 1 succeeded at step 5" in lines[2]
    failure = next(line for line in lines if "failure  " in line)
    assert "exit_code: rank 1, exit code 3 (attempt 0)" in failure
    assert any("restart  1 of 1" in line for line in lines)
    assert lines[-1] == "1 failure(s), 1 restart(s), 0 hang(s)"
    assert lines[-2].startswith("rendezvous: 2 wait(s), ")
    assert [i for i, line in enumerate(lines) if "failure  " in line] < [
        i for i, line in enumerate(lines) if "restart  " in line
    ]


def test_a_directory_without_events_is_a_usage_error(tmp_path: Path) -> None:
    done = _timeline(str(tmp_path))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"phalanx: error: timeline: {str(tmp_path)!r} is not a phalanx run directory; give "
        "the run's directory, or its name as 'phalanx ls' lists the runs in "
    ), line


def _event(seq: int, kind: str, t: float, **fields: object) -> dict[str, object]:
    return {"v": 1, "t": t, "mono": t, "seq": seq, "node": 0, "host": "h<1>", "kind": kind,
            **fields}  # fmt: skip


def test_text_from_the_events_is_escaped_and_a_hang_is_marked(tmp_path: Path) -> None:
    events = [
        _event(0, "run_start", 100.0, run_id="<b>id</b>"),
        _event(1, "rdzv_start", 100.0, attempt=1),
        _event(2, "rdzv_done", 101.0, round=0, attempt=1, num_nodes=1, world_size=1),
        _event(3, "workers_started", 101.5, round=0, attempt=1, ranks=[0], pids=[7]),
        _event(4, "progress", 103.0, round=0, rank=0, step=4, beats=4),
        _event(5, "hang", 110.0, round=0, attempt=1, ranks=[0], suspects=[0]),
        _event(6, "failure", 110.0, round=0, attempt=1, rank=0, failure_kind="hang",
               reason='<script>alert("x")</script> & more', local=True),
        _event(7, "worker_exit", 111.0, round=0, attempt=1, rank=0, returncode=-9,
               failed=False, stopped_by_phalanx=True),
        _event(8, "job_end", 111.5, outcome="failed", exit_code=1),
    ]  # fmt: skip
    path = tmp_path / EVENTS_FILE
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    page = render(build(read_events(path)))
    assert "<script" not in page and "<b>id" not in page and "h<1>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in page
    assert "&lt;b&gt;id&lt;/b&gt;" in page and 'data-host="h&lt;1&gt;"' in page
    assert '<g class="hang" data-kind="hang" data-rank="0">' in page
    assert '<g class="failure" data-kind="hang" data-rank="0">' in page
    assert '<g class="attempt" data-rank="0" data-attempt="0" data-outcome="stopped">' in page


def test_every_node_is_a_group_and_a_peer_failure_is_not_shown_twice() -> None:
    """Two agents' streams, one after the other (as gathered from the nodes): each node's
    ranks under its own heading; the failure each node recorded is shown once, the failing
    node's own."""

    def node(node_rank: int, host: str, rank: int, local: bool) -> list[dict[str, object]]:
        tagged = [
            _event(0, "rdzv_start", 1.0, attempt=1),
            _event(1, "rdzv_done", 2.0, round=0, attempt=1, num_nodes=2, world_size=2),
            _event(2, "workers_started", 3.0, round=0, attempt=1, ranks=[rank], pids=[9]),
            _event(3, "failure", 5.0, round=0, attempt=1, rank=1, failure_kind="signal",
                   local=local),
            _event(4, "restart", 6.0 + node_rank, restart=1, max_restarts=2, round=0),
        ]  # fmt: skip
        return [{**e, "node": node_rank, "host": host} for e in tagged]

    timeline = build(node(0, "a", 0, False) + node(1, "b", 1, True))
    assert [(g.node, g.host, g.ranks) for g in timeline.groups] == [(0, "a", (0,)), (1, "b", (1,))]
    assert [(m.kind, m.rank, m.group) for m in timeline.failures] == [("signal", 1, (1, "b"))]
    assert [(r.restart, r.t) for r in timeline.restarts] == [(1, 6.0)]
    assert [a.outcome for a in timeline.attempts] == ["running", "running"]
    assert len(timeline.waits) == 2


def test_a_round_that_ended_before_its_workers_started_has_no_lanes_but_its_incident() -> None:
    """A round whose node check stopped on a lost member ends before its workers start (the
    agent's ``_unstarted``): ``failure`` and ``stopped`` (0 s), no ``workers_started``. The
    timeline draws lanes for the next round only and the failure once; the recovery figures
    count the incident, from the failure to the next round's first progress."""
    events = [
        _event(0, "run_start", 100.0, run_id="r"),
        _event(1, "rdzv_start", 100.0, attempt=1),
        _event(2, "rdzv_done", 101.0, round=0, attempt=1, num_nodes=3, world_size=3,
               restart_count=0),
        _event(3, "node_lost", 105.0, round=0, lost_node=1, lost_host="b", reason="gone"),
        _event(4, "failure", 105.0, round=0, attempt=1, rank=None, failed_node=1,
               failure_kind="node_lost", reason="node 1 was lost: gone", exit_code=None,
               local=False, failed_at=None, detected_at=105.0),
        _event(5, "stopped", 105.0, round=0, attempt=1, seconds=0.0),
        _event(6, "restart", 105.5, restart=1, max_restarts=1, round=0),
        _event(7, "rdzv_start", 105.5, attempt=2),
        _event(8, "rdzv_done", 107.0, round=1, attempt=2, num_nodes=2, world_size=2,
               restart_count=1),
        _event(9, "workers_started", 107.5, round=1, attempt=2, ranks=[0], pids=[8]),
        _event(10, "progress", 108.0, round=1, rank=0, step=1, beats=1, age=0.1),
        _event(11, "worker_exit", 109.0, round=1, attempt=2, rank=0, returncode=0,
               failed=False, stopped_by_phalanx=False),
        _event(12, "job_end", 109.5, outcome="succeeded", exit_code=0),
    ]  # fmt: skip
    timeline = build(events)
    assert [(a.round, a.attempt, a.outcome) for a in timeline.attempts] == [(1, 1, "succeeded")]
    assert [(m.kind, m.rank) for m in timeline.failures] == [("node_lost", None)]
    assert [w.round for w in timeline.waits] == [0, 1]
    assert 'data-kind="node_lost"' in render(timeline)
    (incident,) = recovery(events).incidents
    assert (incident.round, incident.stop, incident.recovered) == (0, 0.0, True)
    assert incident.reform == 2.0 and incident.back == 1.0  # 105 -> 107 -> 108
