"""The warm service's key (which launches share a service), its directory's checks, and what
it refuses to give a job (the settings each worker takes from its own agent)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from phalanx.service import job
from phalanx.service.key import keyed, service_env, service_key
from phalanx.service.paths import UnsafeDirectory, service_dir

BASE = {"PATH": "/usr/bin", "HOME": "/home/u", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize(
    ("name", "is_keyed"),
    [
        ("OMP_NUM_THREADS", True), ("MKL_NUM_THREADS", True), ("LD_PRELOAD", True),
        ("LD_LIBRARY_PATH", True), ("PYTHONPATH", True), ("PYTHONHASHSEED", True),
        ("TORCH_LOGS", True), ("PYTORCH_CUDA_ALLOC_CONF", True), ("CUDA_HOME", True),
        ("HOME", True), ("LC_ALL", True), ("CUDA_VISIBLE_DEVICES", False),
        ("SLURM_JOB_ID", False), ("RANK", False), ("MY_SECRET", False), ("PWD", False),
    ],
)  # fmt: skip
def test_which_variables_are_keyed(name: str, is_keyed: bool) -> None:
    assert keyed(name) is is_keyed


def test_the_service_gets_only_the_keyed_variables() -> None:
    env = {**BASE, "MY_SECRET": "x", "RANK": "3"}
    assert service_env(env) == BASE


def test_the_key_changes_with_what_acts_at_import_only(tmp_path: Path) -> None:
    cwd = str(tmp_path)
    key = service_key(BASE, (), cwd)
    assert service_key({**BASE, "SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "1"}, (), cwd) == key
    assert service_key({**BASE, "OMP_NUM_THREADS": "4"}, (), cwd) != key
    assert service_key({**BASE, "LD_PRELOAD": "/x.so"}, (), cwd) != key
    assert service_key(BASE, ("json",), cwd) != key


def test_the_key_changes_when_a_package_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    key, lineage = service_key(BASE, (), "/")
    (site / "newpkg-1.0.dist-info").mkdir()
    assert service_key(BASE, (), "/") == (service_key(BASE, (), "/")[0], lineage)  # stale
    assert service_key(BASE, (), "/")[0] != key


def test_the_key_changes_when_a_preloaded_module_of_ones_own_changes(tmp_path: Path) -> None:
    package = tmp_path / "mine"
    package.mkdir()
    (package / "__init__.py").write_text("A = 1\n")
    before = service_key(BASE, ("mine.sub",), str(tmp_path))
    (package / "sub.py").write_text("B = 2\n")
    assert service_key(BASE, ("mine.sub",), str(tmp_path)) != before


def test_the_directory_is_made_private_and_checked(tmp_path: Path) -> None:
    made = service_dir({"XDG_RUNTIME_DIR": str(tmp_path)})
    assert made == tmp_path / "phalanx-service" and (os.stat(made).st_mode & 0o777) == 0o700
    os.chmod(made, 0o755)
    with pytest.raises(UnsafeDirectory, match="mode 755"):
        service_dir({"XDG_RUNTIME_DIR": str(tmp_path)})
    other = tmp_path / "other"
    other.mkdir()
    (other / "phalanx-service").symlink_to(made)
    with pytest.raises(UnsafeDirectory, match="not a directory"):
        service_dir({"XDG_RUNTIME_DIR": str(other)})


def test_the_agents_settings_are_read_without_changing_them() -> None:
    old = os.umask(0o027)
    try:
        settings = job.collect()
        assert settings.umask == 0o027 and os.umask(0o027) == 0o027
    finally:
        os.umask(old)
    assert job.JobSettings.from_json(settings.to_json()) == settings
    assert job.refusal(settings) is None  # this process can give a child its own settings


def test_the_launchers_own_first_path_entry_is_not_in_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `phalanx` puts its bin directory there, `python -m phalanx` the working directory; the
    # service and its workers drop it (isolated_main): the two launches share one service.
    key = service_key(BASE, (), "/")
    monkeypatch.setattr(sys, "path", ["/usr/local/bin", *sys.path[1:]])
    assert service_key(BASE, (), "/") == key


def test_the_key_changes_with_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    key = service_key(BASE, (), "/")
    monkeypatch.setattr(sys, "executable", "/opt/other/bin/python3")
    assert service_key(BASE, (), "/") != key


def test_a_launch_under_nice_or_a_lower_hard_limit_gets_a_service_of_its_own() -> None:
    probe = (
        "import os, resource, sys; sys.path[:0] = sys.argv[1:]; "
        "from phalanx.service.key import service_key; "
        f"print(service_key({BASE!r}, (), '/'))"
    )

    def run(preexec: Callable[[], None]) -> str:
        return subprocess.run([sys.executable, "-c", probe, *sys.path], preexec_fn=preexec,
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip

    key = run(lambda: None)
    assert run(lambda: None) == key
    assert run(lambda: os.nice(5)) != key
    lower = resource.getrlimit(resource.RLIMIT_CORE)[1]
    lower = 1024 if lower == resource.RLIM_INFINITY else max(0, lower - 1)
    assert run(lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, lower))) != key


def test_what_a_service_cannot_give_a_job_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    own = job.collect()
    name, number = "RLIMIT_CORE", resource.RLIMIT_CORE
    hard = resource.getrlimit(number)[1]
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # without privilege
    if hard != resource.RLIM_INFINITY:
        higher = {**own.limits, name: (0, resource.RLIM_INFINITY)}
        assert "hard RLIMIT_CORE" in str(job.refusal(replace(own, limits=higher)))
    assert "nice value" in str(job.refusal(replace(own, nice=own.nice - 1)))
    for hierarchy, path in own.cgroups.items():  # where this machine has cgroups
        elsewhere = {**own.cgroups, hierarchy: f"{path}/no-such-cgroup"}
        refused = str(job.refusal(replace(own, cgroups=elsewhere)))
        assert "could not join the job's cgroups" in refused
    assert job.refusal(own) is None
