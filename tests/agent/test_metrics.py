"""``--metrics-port``: a real job's Prometheus metrics scraped while it runs, after one
failure and one restart; a port in use or a missing library stops the launch in one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import prometheus_client
import psutil
import pytest

from phalanx.events import EVENTS_FILE, read_events
from phalanx.events.metrics import MetricsServer
from phalanx.resources.ports import free_port
from support.launch import PHALANX, launched, worker


def _scrape(port: int) -> dict[str, float]:
    """Every sample of the page, as ``name{labels}`` -> value (``# HELP``/``# TYPE`` skipped)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_a_running_job_is_scraped_with_its_restart_failure_and_rates(tmp_path: Path) -> None:
    port = free_port()
    args = ["--nproc-per-node", "2", "--max-restarts", "1", "--metrics-port", str(port),
            "--log-dir", str(tmp_path / "logs"),
            worker("steps_then_fail.py"), "2000", "1", "2"]  # fmt: skip
    seen: dict[str, float] = {}
    with launched(args) as job:
        deadline = time.monotonic() + 90
        # Two progress samples (2 s apart) of each rank after the restart give the rates.
        wanted = ('phalanx_steps_per_second{rank="0"}', 'phalanx_steps_per_second{rank="1"}')
        while time.monotonic() < deadline and job.poll() is None:
            try:
                seen = _scrape(port)
            except OSError:
                seen = {}
            if seen.get("phalanx_restarts_total") == 1 and all(k in seen for k in wanted):
                break
            time.sleep(0.3)
        assert job.poll() is None, job.communicate()
        os.killpg(job.pid, signal.SIGTERM)
        _, err = job.communicate(timeout=60)
    assert seen.get("phalanx_restarts_total") == 1, (seen, err)
    assert seen['phalanx_failures_total{kind="exit_code"}'] == 1
    assert [k for k in seen if k.startswith("phalanx_failures_total")] == [
        'phalanx_failures_total{kind="exit_code"}'
    ]
    for rank in ("0", "1"):
        assert seen[f'phalanx_steps_per_second{{rank="{rank}"}}'] > 0
        assert seen[f'phalanx_step{{rank="{rank}"}}'] >= 0
    assert seen["phalanx_rendezvous_seconds_count"] == 2  # the first round and the restart's
    assert seen["phalanx_time_to_first_step_seconds"] >= 0
    assert f"metrics: http://127.0.0.1:{port}/metrics" in err
    assert job.returncode == 143
    # The numbers are the event log's.
    events = read_events(next((tmp_path / "logs").glob(f"*/{EVENTS_FILE}")))
    kinds = [e["kind"] for e in events]
    assert kinds.count("restart") == 1 and kinds.count("failure") == 1
    assert kinds.count("rdzv_done") == 2


def test_the_metrics_listen_on_loopback_only_by_default(tmp_path: Path) -> None:
    """Bound to 127.0.0.1: from this host's other addresses the port is closed."""
    others = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    assert others, "this host has no address besides loopback to try"
    port = free_port()
    args = ["--metrics-port", str(port), "--log-dir", str(tmp_path / "logs"),
            worker("steps_then_fail.py"), "2000", "9", "9"]  # fmt: skip
    with launched(args) as job:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job.poll() is None:
            try:
                _scrape(port)
                break
            except OSError:
                time.sleep(0.2)
        assert "phalanx_restarts_total" in _scrape(port)
        for address in others:
            with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
                probe.settimeout(5)
                probe.connect((address, port))
        os.killpg(job.pid, signal.SIGTERM)
        job.communicate(timeout=60)


def test_the_metrics_are_on_a_registry_of_their_own() -> None:
    """Not prometheus_client's global one, which a user's code could share or fill."""
    server = MetricsServer("127.0.0.1", free_port())
    try:
        server.record({"kind": "restart", "mono": 1.0})
        assert server.registry.get_sample_value("phalanx_restarts_total") == 1
        assert prometheus_client.REGISTRY.get_sample_value("phalanx_restarts_total") is None
    finally:
        server.close()


def test_a_ranks_rate_is_absent_from_a_new_rounds_forming_until_measured_in_it() -> None:
    """A failed round's rates do not stand for ranks that are restarting: the series goes when
    the next round forms and comes back with the rank's second sample in it (the events as
    the agent writes them; the real job above scrapes the same listener)."""
    server = MetricsServer("127.0.0.1", free_port())
    rate = "phalanx_steps_per_second"
    try:
        value = lambda rank: server.registry.get_sample_value(rate, {"rank": rank})  # noqa: E731
        server.record({"kind": "rdzv_done", "mono": 0.0, "seconds": 0.1})
        for mono, step in ((1.0, 0), (3.0, 10)):
            for rank in (0, 1):
                server.record({"kind": "progress", "mono": mono, "rank": rank, "step": step})
        assert (value("0"), value("1")) == (5.0, 5.0)
        server.record({"kind": "restart", "mono": 4.0})
        assert value("0") == 5.0  # the restart is spent; the round has not formed yet
        server.record({"kind": "rdzv_done", "mono": 5.0, "seconds": 0.2})
        assert (value("0"), value("1")) == (None, None)
        server.record({"kind": "progress", "mono": 6.0, "rank": 0, "step": 10})
        assert value("0") is None  # one sample of the new round: no rate yet
        server.record({"kind": "progress", "mono": 8.0, "rank": 0, "step": 30})
        assert (value("0"), value("1")) == (10.0, None)
        server.record({"kind": "rdzv_done", "mono": 9.0, "seconds": 0.1})  # rank 1 never rated
        assert value("0") is None
    finally:
        server.close()


def test_a_port_in_use_stops_the_launch_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*PHALANX, "--metrics-port", str(port), "--log-dir", str(tmp_path / "logs"),
             worker("steps_then_fail.py"), "1", "9", "9"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"phalanx: error: --metrics-port {port}: cannot listen on 127.0.0.1:")
    assert "choose another port" in line
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())


def test_without_the_library_the_flag_is_refused_in_one_line(tmp_path: Path) -> None:
    # The library hidden from this process only: an import of it fails as if not installed.
    hide = "import sys; sys.modules['prometheus_client'] = None; from phalanx.cli.main import main"
    done = subprocess.run(
        [sys.executable, "-c", f"{hide}; sys.exit(main())", "--metrics-port", "9",
         worker("steps_then_fail.py"), "1", "9", "9"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "phalanx: error: --metrics-port needs the prometheus-client library: "
        "pip install 'phalanx[metrics]'"
    ]


def test_the_launcher_does_not_import_the_library_without_the_flag() -> None:
    probe = (
        "import sys; import phalanx.cli.main; from phalanx.cli.argv import parse_config; import phalanx.agent.agent; "
        f"parse_config([{worker('steps_then_fail.py')!r}], {{}}); "
        "print('prometheus_client' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
