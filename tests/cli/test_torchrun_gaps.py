"""What torchrun 2.13 accepts, phalanx accepts, through the real CLI: ``--rdzv-conf timeout``
beside ``join_timeout``, abbreviated flags (before the script only), ``--tee`` over
``--redirects``, ``--logs-specs`` entry points, ``--nproc-per-node xpu``, torchrun's line
prefix template; and what phalanx adds: ``--version``, ``help``, "did you mean", every
default in ``--help``, a line for each given flag the backend does not read."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from support.launch import PHALANX, worker

SCRIPT = worker("echo_args.py")


def cli(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    return subprocess.run(
        [*PHALANX, *args], capture_output=True, text=True, timeout=180,
        cwd=cwd or tmp_path, env={**environ, **(env or {})},
    )  # fmt: skip


def job(args: list[str], tmp_path: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    """A one-node job, cold-started (the echo worker needs no torch)."""
    return cli(["--cold-start", "--log-dir", str(tmp_path / "logs"), *args], tmp_path, **kw)  # type: ignore[arg-type]


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    return line


def test_c10d_accepts_timeout_beside_join_timeout(tmp_path: Path) -> None:
    """torchrun's c10d handler never reads ``timeout``: accepted, and said to be unused."""
    done = job(["--rdzv-backend", "c10d", "--rdzv-conf", "timeout=30,join_timeout=60", SCRIPT],
               tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--rdzv-conf timeout: accepted as torchrun does, not used (c10d never reads it)" in (
        done.stderr
    )
    many = cli(["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1",
                "--rdzv-conf", "timeout=30,join_timeout=60", "--dry-run", SCRIPT], tmp_path)  # fmt: skip
    assert many.returncode == 0, many.stderr
    # PyTorch's own test_run.py passes the list with its shell quotes, literally
    quoted = cli(["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1",
                  "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'", "--dry-run",
                  SCRIPT], tmp_path)  # fmt: skip
    assert quoted.returncode == 0, quoted.stderr


def test_abbreviations_stop_at_the_script(tmp_path: Path) -> None:
    """``--redirect=3`` and ``--te 1`` are torchrun's abbreviations; what follows the script
    is the script's, ``--r`` (ambiguous for the launcher) included."""
    done = job(["--nproc", "1", "--redirect=3", "--te", "1", SCRIPT, "--r", "--nn", "x"], tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("[rank0]: {")
               for x in [x.removeprefix("[rank0]: ")]]  # fmt: skip
    assert line["argv"][1:] == ["--r", "--nn", "x"]
    assert "to stderr from 0" not in done.stderr  # redirected, not teed
    ambiguous = error_line(cli(["--r", "3", SCRIPT], tmp_path))
    assert ambiguous.startswith("phalanx: error: ambiguous option: --r could match --rdzv-backend")


def test_tee_shows_a_redirected_stream(tmp_path: Path) -> None:
    """``-r 3 -t 1``: torchrun shows stdout on the console (teed) and keeps stderr in the
    file only; both are in the log files."""
    done = job(["-r", "3", "-t", "1", SCRIPT], tmp_path)
    assert done.returncode == 0, done.stderr
    assert '[rank0]: {"argv"' in done.stdout
    assert "to stderr from 0" not in done.stderr
    (err,) = (tmp_path / "logs").rglob("rank_0/stderr.log")
    assert "to stderr from 0" in err.read_text()


def test_logs_specs_default_runs_and_unknown_is_refused(tmp_path: Path) -> None:
    """``default`` is torch's own entry point; one registered by another package (a real
    dist-info on the path) is accepted and said not to apply; an unregistered name is
    refused as torchrun refuses it."""
    assert job(["--logs-specs=default", SCRIPT], tmp_path).returncode == 0
    site = tmp_path / "site"
    info = site / "my_specs-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-specs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torchrun.logs_specs]\nmine = my_specs:Specs\n")
    env = {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    mine = job(["--logs-specs", "mine", SCRIPT], tmp_path, env=env)
    assert mine.returncode == 0, mine.stderr
    assert "--logs-specs mine is not applied" in mine.stderr
    refused = error_line(job(["--logs-specs", "theirs", SCRIPT], tmp_path))
    assert "could not find entrypoint under 'torchrun.logs_specs[theirs]' key" in refused


def test_nproc_per_node_words(tmp_path: Path) -> None:
    """xpu is one of torchrun's words (no XPU here: refused as torchrun refuses it); a word
    that is none of them lists them all."""
    assert "--nproc-per-node xpu: no XPU device is visible" in error_line(
        cli(["--nproc-per-node", "xpu", SCRIPT], tmp_path)
    )
    assert error_line(cli(["--nproc-per-node", "four", SCRIPT], tmp_path)).endswith(
        "expected a positive integer, auto, cpu, gpu or xpu, got 'four'"
    )


def test_a_misspelt_rdzv_conf_key_is_refused_on_one_node(tmp_path: Path) -> None:
    """Refused everywhere, naming the key and the nearest known one; torchrun ignores any
    key it does not read, phalanx refuses it (a deliberate difference)."""
    for extra in ([], ["--nnodes", "2", "--dry-run"]):
        line = error_line(cli([*extra, "--rdzv-conf", "join_timout=5", SCRIPT], tmp_path))
        assert "--rdzv-conf join_timout: unknown key" in line
        assert "did you mean join_timeout?" in line and "(known: " in line
    # A key torchrun's backend reads is known, though phalanx does not use it.
    etcd = cli(["--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1",
                "--rdzv-conf", "etcd_prefix=/x", "--dry-run", SCRIPT], tmp_path)  # fmt: skip
    assert etcd.returncode == 0, etcd.stderr


def test_every_console_line_carries_its_rank_once(tmp_path: Path) -> None:
    """A line torch already prefixed with the rank is not prefixed again; torchrun's
    TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, when set, is the prefix."""
    done = job([worker("prefixed_lines.py")], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[rank0]: plain line",
        "[rank0]:[W1203 07:00:00 ProcessGroupGloo.cpp:1] a torch warning",
        "[rank0]: Traceback (most recent call last):",
    ]
    template = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${role_name}${local_rank}|${rank}]:"}
    done = job(["--role", "trainer", worker("prefixed_lines.py")], tmp_path, env=template)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "[trainer0|0]:plain line"


def test_version_help_and_near_misses(tmp_path: Path) -> None:
    version = cli(["--version"], tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("phalanx ")
    helped = cli(["help"], tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "phalanx {stacks,status,logs,stop,ls,clean,timeline,check,service,help} ..." in helped.stdout
    assert cli(["help", "status"], tmp_path).stdout.startswith("usage: phalanx status")
    assert error_line(cli(["statu"], tmp_path)).startswith(
        "phalanx: error: 'statu' is neither a training script nor a subcommand; did you mean status?"
    )
    assert error_line(cli(["--mastr-addr", "x", SCRIPT], tmp_path)) == (
        "phalanx: error: unrecognized arguments: --mastr-addr; did you mean --master-addr?"
    )


def test_help_shows_every_default(tmp_path: Path) -> None:
    """Every option's entry in --help says its default (in its own words or at the end)."""
    out = cli(["--help"], tmp_path).stdout
    text = " ".join(out.split())
    for said in ("(default: static)", "(default: 1)", "(default: 0)",
                 "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 5"):  # fmt: skip
        assert said in text, said
    options = out[out.index("\noptions:\n") : out.index("\nexamples:\n")]
    entries = re.split(r"\n  (?=-)", options)[1:]
    assert len(entries) > 40
    missing = [e.split()[0] for e in entries if "default" not in e.lower()
               and not e.startswith(("-h", "--version"))]  # fmt: skip
    assert missing == []


def test_a_script_named_like_a_subcommand_runs(tmp_path: Path) -> None:
    (tmp_path / "status").write_text("print('the script ran')\n")
    for args in (["./status"], ["--", "status"], ["status"]):
        done = job(args, tmp_path)
        assert done.returncode == 0, (args, done.stderr)
        assert "[rank0]: the script ran" in done.stdout, args


def test_a_flag_the_backend_does_not_read_is_said(tmp_path: Path) -> None:
    """torchrun warns that --master-addr is only for static; phalanx says it in one line."""
    done = job(["--rdzv-backend", "c10d", "--master-addr", "10.9.9.9", SCRIPT], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        "--master-addr is only used by the static rendezvous; ignored with --rdzv-backend c10d"
        in done.stderr
    )
