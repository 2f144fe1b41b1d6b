"""A worker forked from the warm-start template cannot tell it from ``python -u script.py``.

Every test runs the real CLI twice over -- warm (the default) and ``--cold-start`` -- and
holds both to the same expectations: argv, ``sys.path[0]``, ``__file__``, ``__main__``,
signal dispositions, exit codes and tracebacks, ``-m``, multiprocessing inside the worker,
and the thread settings torch reads when it loads. The last two, the heaviest (torch in
every process), are in ``test_warm_torch.py``, split so that two pytest workers run them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.launch import run_phalanx, worker
from support.warm_modes import MODES, by_rank, check_mode


@pytest.mark.parametrize("mode", MODES)
def test_script_sees_what_python_gives_it(tmp_path: Path, mode: str) -> None:
    real = tmp_path / "real dir"
    real.mkdir()
    shutil.copy(worker("warm_props.py"), real / "props.py")
    (tmp_path / "link dir").mkdir()
    script = "link dir/it's props.py"  # relative, a symlink, spaces and a quote
    (tmp_path / script).symlink_to(real / "props.py")
    args = ["--lr", "0.1", "a b"]
    result = run_phalanx(
        [*MODES[mode], "--nproc-per-node", "2", "--log-dir", "logs", script, *args], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    check_mode(mode, result.stderr)
    ranks = by_rank(result.stdout)
    assert sorted(ranks) == [0, 1]
    for data in ranks.values():
        cwd = str(data["cwd"])
        assert os.path.samefile(cwd, tmp_path)
        assert data["argv"] == [script, *args]
        assert data["path0"] == os.path.realpath(real)
        assert data["file"] == os.path.join(cwd, script)  # joined, not resolved: python 3.11
        assert data["name"] == "__main__" and data["main_is_globals"] is True
        assert data["main_keys"] == [
            "__annotations__",
            "__builtins__",
            "__cached__",
            "__doc__",
            "__file__",
            "__loader__",
            "__name__",
            "__package__",
            "__spec__",
        ]
        assert (data["loader"], data["spec"], data["package"]) == ("SourceFileLoader", None, None)
        assert data["orig_argv_tail"] == ["-u", script, *args]
        assert data["signals"] == {
            "SIGINT": "<built-in function default_int_handler>",
            "SIGTERM": "<Handlers.SIG_DFL: 0>",
            "SIGPIPE": "<Handlers.SIG_IGN: 1>",
            "SIGXFSZ": "<Handlers.SIG_IGN: 1>",
            "SIGCHLD": "<Handlers.SIG_DFL: 0>",
            "SIGHUP": "<Handlers.SIG_DFL: 0>",
            "SIGUSR1": "<Handlers.SIG_DFL: 0>",
        }
        assert data["mask"] == [] and data["own_group"] is True
        assert data["stdio"] == [False, True, "/dev/null"]  # python -u; stdin from /dev/null
    # Each process seeds torch's generator itself: forked ranks must not share a stream.
    assert ranks[0]["seed"] != ranks[1]["seed"]


@pytest.mark.parametrize("mode", MODES)
def test_module_mode(tmp_path: Path, mode: str) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    shutil.copy(worker("warm_props.py"), tmp_path / "pkg" / "props.py")
    result = run_phalanx([*MODES[mode], "--log-dir", "logs", "-m", "pkg.props", "x"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    check_mode(mode, result.stderr)
    data = by_rank(result.stdout)[0]
    module_file = os.path.join(str(data["cwd"]), "pkg", "props.py")
    assert data["argv"] == [module_file, "x"]
    assert data["path0"] == data["cwd"] and data["file"] == module_file
    assert (data["name"], data["spec"], data["package"]) == ("__main__", "pkg.props", "pkg")
    assert data["orig_argv_tail"] == ["-u", "-m", "pkg.props", "x"]

    result = run_phalanx([*MODES[mode], "--log-dir", "logs", "-m", "pkg.missing"], cwd=tmp_path)
    assert result.returncode == 1
    assert "[rank0]: " in result.stderr and ": No module named pkg.missing" in result.stderr


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["exit3", "raise", "message", "interrupt"])
def test_exit_codes_and_tracebacks(tmp_path: Path, mode: str, how: str) -> None:
    script = worker("warm_exit.py")
    result = run_phalanx([*MODES[mode], "--log-dir", str(tmp_path), script, how])
    check_mode(mode, result.stderr)
    (run_dir,) = tmp_path.iterdir()
    stderr = (run_dir / "attempt_0" / "rank_0" / "stderr.log").read_text().splitlines()
    report = result.stderr[result.stderr.index("=" * 78) :]
    if how == "exit3":
        assert result.returncode == 3 and stderr == []
    elif how == "message":
        assert result.returncode == 1 and stderr == ["bye from the worker"]
    elif how == "raise":
        assert result.returncode == 1
        # Exactly python's traceback: the script's frames only, none of phalanx or runpy.
        assert stderr[0] == "Traceback (most recent call last):"
        assert [line for line in stderr if line.startswith("  File")] == [
            f'  File "{script}", line 17, in <module>',
            f'  File "{script}", line 10, in outer',
            f'  File "{script}", line 6, in inner',
        ]
        assert stderr[-1] == "ValueError: boom"
        assert "ValueError: boom" in report and "Traceback (most recent call last)" in report
    else:  # python ends by SIGINT after an uncaught KeyboardInterrupt
        assert result.returncode == 128 + signal.SIGINT
        assert stderr[-1] == "KeyboardInterrupt" and "killed by SIGINT" in report


def leftovers(folder: Path) -> dict[str, str]:
    import gzip

    found = {p.name: p.read_bytes().hex() for p in folder.iterdir() if p.suffix != ".gz"}
    with gzip.open(folder / "log.gz", "rt") as handle:  # a truncated stream raises here
        found["log.gz"] = handle.read()
    return found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("status", [0, 4])
def test_what_a_script_leaves_at_exit_is_done_as_python_does(
    tmp_path: Path, mode: str, status: int
) -> None:
    """Differential: the same script under plain ``python -u`` is the reference. A warm
    worker leaves without interpreter teardown (phalanx.worker.leave); nothing may be lost:
    unclosed buffered files (text, binary, gzip) complete, the non-daemon thread joined before
    atexit ran, the executor's work done, stdout flushed, the exit status kept."""
    script = worker("exit_leftovers.py")
    reference = subprocess.run(
        [sys.executable, "-u", script, str(tmp_path / "ref"), str(status)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert reference.returncode == status and reference.stdout == "leaving\n"
    ranks = ["0", "1"] if status == 0 else ["0"]  # a failing rank has its peers stopped
    result = run_phalanx(
        [*MODES[mode], "--nproc-per-node", str(len(ranks)), "--log-dir", str(tmp_path / "logs"),
         script, str(tmp_path / "out"), str(status)]
    )  # fmt: skip
    check_mode(mode, result.stderr)
    assert result.returncode == status, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"[rank{r}]: leaving" for r in ranks]
    expected = leftovers(tmp_path / "ref" / "plain")
    assert set(expected) == {"text.txt", "data.bin", "log.gz", "thread.txt", "atexit.txt"}
    assert bytes.fromhex(expected["atexit.txt"]) == b"atexit ran; thread alive: False"
    for rank in ranks:
        assert leftovers(tmp_path / "out" / rank) == expected
