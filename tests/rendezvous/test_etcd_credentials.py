"""etcd passwords from a file or the environment, never shown (docs/how-to/etcd.md).

Tier (a): the options and the workers' environment as data. Tier (c): the real CLI against a
real etcd with auth enabled (``support.etcd_server.enable_auth``); while the job runs, every
process of it is read from ``/proc`` (command line and environment), and afterwards its logs,
its run directory, ``--dry-run`` and the error of a misspelt key are searched for the password.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from phalanx.errors import UsageError
from phalanx.rendezvous.credentials import ETCD_PASSWORD_ENV, worker_environment
from phalanx.rendezvous.stores.etcd.conf import (
    EtcdOptions,
    credential_warnings,
    etcd_options_from_conf,
)
from support.etcd_server import EtcdCluster, enable_auth
from support.launch import PHALANX, launched, wait_for, worker
from support.tools import needs_etcd

HANG = 120.0  # bounds that only catch a hang
PASSWORD = f"pw-{uuid.uuid4().hex}"  # unique: any occurrence found is this test's leak
CONF = "last_call_timeout=1,join_timeout=60,exit_barrier_timeout=30"


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "etcd password"
    path.write_text(PASSWORD + "\n")  # as `echo "$pw" > file` writes it
    path.chmod(0o600)
    return path


# -- tier (a): options and environment as data ------------------------------------------------


def test_the_password_from_a_file_or_the_environment(password_file: Path) -> None:
    from_file = etcd_options_from_conf(
        {"user": "u", "password_file": str(password_file)}, environ={}
    )
    assert from_file.password == PASSWORD and from_file.password_source.endswith("password_file")
    from_env = etcd_options_from_conf({"user": "u"}, environ={ETCD_PASSWORD_ENV: PASSWORD})
    assert from_env.password == PASSWORD and from_env.password_source == ETCD_PASSWORD_ENV
    # The conf wins over the environment; an empty variable is no password.
    both = {"user": "u", "password_file": str(password_file)}
    assert etcd_options_from_conf(both, environ={ETCD_PASSWORD_ENV: "other"}).password == PASSWORD
    assert etcd_options_from_conf({}, environ={ETCD_PASSWORD_ENV: ""}) == EtcdOptions()
    assert PASSWORD not in repr(from_file) and PASSWORD not in str(from_env)


def test_password_problems_name_the_key_never_the_value(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    unreadable = tmp_path / "missing"
    cases = [
        ({"user": "u", "pasword": PASSWORD}, "--rdzv-conf pasword: unknown key for etcd"),
        ({"user": "u", "password": PASSWORD, "password_file": str(empty)}, "not both"),
        ({"user": "u", "password_file": str(empty)}, "the file is empty"),
        ({"user": "u", "password_file": str(unreadable)}, "cannot read it (No such file"),
        ({"password_file": str(empty.with_name("x"))}, "cannot read it"),
    ]
    for conf, message in cases:
        with pytest.raises(UsageError) as info:
            etcd_options_from_conf(conf, environ={})
        text = "\n".join(info.value.problems)
        assert message in text and PASSWORD not in text, (conf, text)
    with pytest.raises(UsageError, match=rf"given \({ETCD_PASSWORD_ENV}\) without user"):
        etcd_options_from_conf({}, environ={ETCD_PASSWORD_ENV: PASSWORD})


def test_warnings_about_how_the_password_is_given_and_sent() -> None:
    http, https = ["http://10.0.0.1:2379"], ["https://10.0.0.1:2379"]
    on_argv = etcd_options_from_conf({"user": "u", "password": PASSWORD}, environ={})
    from_env = etcd_options_from_conf({"user": "u"}, environ={ETCD_PASSWORD_ENV: PASSWORD})
    assert [n.split(",")[0] for n in credential_warnings(on_argv, https)] == [
        "the etcd password is given as --rdzv-conf password=..."
    ]
    assert [n.split(",")[0] for n in credential_warnings(from_env, http)] == [
        "the etcd password travels over plain http to http://10.0.0.1:2379"
    ]
    assert credential_warnings(from_env, https) == []
    assert credential_warnings(EtcdOptions(user="u"), http) == []  # no password, nothing to say
    assert all(PASSWORD not in n for n in credential_warnings(on_argv, http))


def test_workers_inherit_no_secret() -> None:
    env = {
        "PATH": "/bin",
        ETCD_PASSWORD_ENV: PASSWORD,
        "PET_RDZV_CONF": f"user=u, password ={PASSWORD},join_timeout=5",
    }
    assert worker_environment(env) == {"PATH": "/bin", "PET_RDZV_CONF": "user=u,join_timeout=5"}


# -- tier (c): the real CLI, a real etcd with auth --------------------------------------------


def _cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PHALANX, *args], capture_output=True, text=True, timeout=HANG, env=env
    )  # fmt: skip


def test_a_misspelt_key_and_dry_run_do_not_show_the_password(
    password_file: Path, tmp_path: Path
) -> None:
    etcd = ["--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1"]
    misspelt = _cli([*etcd, "--rdzv-conf", f"user=u,pasword={PASSWORD}", worker("chatty.py")])
    assert misspelt.returncode == 2 and "pasword" in misspelt.stderr, misspelt.stderr
    assert len(misspelt.stderr.strip().splitlines()) == 1 and PASSWORD not in misspelt.stderr
    # A password given in PET_RDZV_CONF (torchrun's environment spelling of --rdzv-conf) and
    # one in the environment: --dry-run shows neither, and says the worker does not get them.
    env = {
        **os.environ,
        "PET_RDZV_CONF": f"user=u,password={PASSWORD}",
        ETCD_PASSWORD_ENV: PASSWORD,
    }
    dry = _cli([*etcd, "--dry-run", worker("chatty.py")], env=env)
    assert dry.returncode == 0, dry.stderr
    assert PASSWORD not in dry.stdout + dry.stderr
    assert (
        "PET_RDZV_CONF=user=u" in dry.stdout and f"{ETCD_PASSWORD_ENV} not passed on" in dry.stdout
    )
    conf = f"user=u,password_file={password_file}"
    dry = _cli([*etcd, "--rdzv-conf", conf, "--dry-run", worker("chatty.py")])
    assert dry.returncode == 0 and PASSWORD not in dry.stdout + dry.stderr, dry.stderr


@pytest.fixture(scope="module")
def etcd_auth() -> Iterator[EtcdCluster]:
    with EtcdCluster(size=1) as cluster:
        enable_auth(cluster, {"alice": (PASSWORD, "/phalanx/")})
        yield cluster


def _job_processes(agents: list[psutil.Process]) -> list[psutil.Process]:
    found = list(agents)
    for agent in agents:
        found += agent.children(recursive=True)
    return found


def _secret_in(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return PASSWORD.encode() in handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return False


@needs_etcd
def test_a_job_authenticates_from_a_file_and_the_environment_and_shows_it_nowhere(
    etcd_auth: EtcdCluster, password_file: Path, tmp_path: Path
) -> None:
    endpoint = etcd_auth.endpoints[0].removeprefix("http://")
    gate = tmp_path / "gate"
    gate.mkdir()
    logs = tmp_path / "logs"
    common = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
        "--rdzv-endpoint", endpoint, "--rdzv-id", uuid.uuid4().hex, "--log-dir", str(logs),
    ]  # fmt: skip
    hold = [worker("hold_until_go.py"), str(gate), "1"]  # rank 1 fails: a report.json is written
    by_file = [*common, "--rdzv-conf", f"{CONF},user=alice,password_file={password_file}"]
    by_env = [*common, "--rdzv-conf", f"{CONF},user=alice"]
    env = {**os.environ, ETCD_PASSWORD_ENV: PASSWORD}
    with launched([*by_file, *hold]) as first, launched([*by_env, *hold], env=env) as second:
        agents = [first, second]

        def ready() -> bool:
            if any(a.poll() is not None for a in agents):
                raise AssertionError(
                    "an agent exited early:\n" + "".join(a.communicate()[1] for a in agents)
                )
            return (gate / "ready0").exists() and (gate / "ready1").exists()

        wait_for(ready, HANG, "both workers")
        processes = _job_processes([psutil.Process(a.pid) for a in agents])
        kinds = {" ".join(p.cmdline()[:3]) for p in processes}
        assert len(processes) >= 6, kinds  # 2 x (agent, guardian, template, worker)
        for proc in processes:
            assert not _secret_in(f"/proc/{proc.pid}/cmdline"), proc.cmdline()
            # The second agent was given the variable, as a user's shell would; nothing
            # it starts inherits it.
            if proc.pid != second.pid:
                assert not _secret_in(f"/proc/{proc.pid}/environ"), proc.cmdline()
        (gate / "go").touch()
        outputs = [a.communicate(timeout=HANG) for a in agents]
    for agent, (out, err) in zip(agents, outputs, strict=True):
        assert agent.returncode == 3, err  # the job formed, ran, and rank 1 failed as told
        assert PASSWORD not in out + err
        assert err.count("the etcd password travels over plain http") == 1, err
    written = [p for p in logs.rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"stdout.log", "report.json", "launcher.json"} <= names, names
    assert [p for p in written if _secret_in(str(p))] == []


@needs_etcd
def test_a_wrong_password_fails_in_one_line_without_showing_it(
    etcd_auth: EtcdCluster, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text(f"not-{PASSWORD}\n")
    endpoint = etcd_auth.endpoints[0].removeprefix("http://")
    args = [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
        "--rdzv-endpoint", endpoint, "--rdzv-id", "wrong", "--log-dir", str(tmp_path / "l"),
        "--rdzv-conf", f"{CONF},user=alice,password_file={wrong}", worker("chatty.py"), "1",
    ]  # fmt: skip
    done = _cli(args)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "did not accept user 'alice'" in line]
    assert len(errors) == 1, done.stderr
    assert PASSWORD not in done.stderr and "Traceback" not in done.stderr


def test_help_says_where_the_password_and_the_logs_go() -> None:
    text = " ".join(_cli(["--help"]).stdout.split())
    assert "password_file=PATH or the PHALANX_ETCD_PASSWORD variable" in text
    assert "(default: $TMPDIR/phalanx-<uid>, yours only, mode 0700;" in text
