"""The README's first command, run as a new user would: in a fresh copy of the repository,
with the base Python on PATH (not this suite's virtualenv), into a new virtualenv that sees
no system site packages -- so a dependency the main job forgets to declare fails here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_block(marker: str) -> str:
    """The shell command between ``<!-- marker -->`` and ``<!-- /marker -->`` in README.md."""
    text = (ROOT / "README.md").read_text()
    found = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)\n```\n<!-- /{marker} -->", text, re.S)
    assert found is not None, f"README.md has no {marker} block"
    return found.group(1).strip()


def fresh_copy(target: Path) -> None:
    """The files git tracks, and new ones it does not ignore (no .venv, no build output)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True, timeout=60,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def user_environment() -> dict[str, str]:
    """This environment as a shell outside any virtualenv has it: the base Python first."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    ours = os.path.dirname(sys.executable)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != ours]
    env["PATH"] = os.pathsep.join([os.path.join(sys.base_prefix, "bin"), *path])
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


@pytest.mark.slow
def test_the_main_job_command_works_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    command = readme_block("main-job")
    copy = tmp_path / "phalanx copy"  # a space in the path, as users have
    fresh_copy(copy)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=copy, env=user_environment(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (copy / "runs" / "tiny" / "final.pt").is_file()
    config = (copy / ".venv" / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in config
    assert "phalanx: all 2 workers finished" in done.stderr, done.stderr[-3000:]


def test_the_test_command_is_what_ci_runs() -> None:
    """.ci/run reads the test command from the README; both must stay in step."""
    command = readme_block("test-command")
    assert command.startswith("bash scripts/setup-test-env.sh && . .venv/bin/activate")
    assert "pytest" in command and " -x" not in command and "--durations=20" in command
    ci = (ROOT / ".ci" / "run").read_text()
    assert "test-command" in ci
