"""The warm service (``--keep-warm``): a second launch forks from the first one's service and
still sees its own code, environment, directory, umask, limits and signals; the socket is
the user's only; a service killed mid-launch leaves a fresh template to do the job; an agent
SIGKILLed with its guardian still leaves no worker; and the suite leaves no service."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from phalanx.resources.ports import free_port
from phalanx.service.client import ask_all
from phalanx.service.paths import service_dir, sockets
from phalanx.supervisor.cgroup import hierarchies
from support.launch import (
    PHALANX,
    alive,
    launched,
    remove_job_cgroups,
    run_phalanx,
    wait_for,
    worker,
)
from support.services import end_services, service_pids

HANG = 120.0  # only catches a hang
KEEP = ["--keep-warm", "600"]  # past every wait below: no service ends idle during a test
FAST = "heartbeat_interval=0.5,heartbeat_timeout=10,last_call_timeout=1,join_timeout=60"


def seen(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line.split("]: ", 1)[1]) for line in stdout.splitlines() if "]: {" in line]


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe and its ``helper`` module, in a directory of their own."""
    where = tmp_path_factory.mktemp("job")
    shutil.copy(worker("service_probe.py"), where / "probe.py")
    (where / "helper.py").write_text("VALUE = 1\n")
    return where


@pytest.fixture(autouse=True, scope="module")
def no_service_left() -> object:
    yield None
    assert end_services(os.environ) == [], "a service did not end when asked to stop"


V1_CPU = Path("/sys/fs/cgroup/cpu")  # a cgroup v1 hierarchy, where this machine has one


@pytest.fixture
def v1_cgroup() -> Iterator[Path | None]:
    """A cgroup of the v1 ``cpu`` hierarchy for the second launch's agent; None where none
    can be made (then that part of the test is left out)."""
    path = V1_CPU / f"svctest-{os.getpid()}"
    try:
        path.mkdir()
    except OSError:
        yield None
        return
    try:
        yield path
    finally:
        wait_for(lambda: not (path / "cgroup.procs").read_text().split(), HANG, "its members gone")
        path.rmdir()


def _second_job_settings(cgroup: Path | None) -> Callable[[], None]:
    def settings() -> None:
        os.umask(0o077)
        hard = resource.getrlimit(resource.RLIMIT_MSGQUEUE)[1]
        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (4096, hard))
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")

    return settings


def test_the_next_launch_forks_from_the_service_and_keeps_nothing_of_the_first(
    job_dir: Path, tmp_path: Path, v1_cgroup: Path | None
) -> None:
    end_services(os.environ)  # whatever order the tests run in, the first launch starts one
    first_env = {**os.environ, "PROBE_MARK": "one", "PROBE_ONLY_FIRST": "1"}
    args = [*KEEP, "--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs")]
    first = run_phalanx([*args, "probe.py"], cwd=job_dir, env=first_env, timeout=HANG)
    assert first.returncode == 0, first.stderr
    assert "started by this launch" in first.stderr
    # A changed module (a new size: a .pyc is checked by mtime in seconds, and size).
    (job_dir / "helper.py").write_text("VALUE = 22\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second = run_phalanx(
        [*args, str(job_dir / "probe.py")], cwd=elsewhere, timeout=HANG,
        env={**os.environ, "PROBE_MARK": "two"}, preexec_fn=_second_job_settings(v1_cgroup),
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert "already warm" in second.stderr
    one, two = seen(first.stdout), seen(second.stdout)
    assert len(one) == len(two) == 2
    (service,) = {w["ppid"] for w in one + two}  # every worker of both forked from one service
    assert service in service_pids(os.environ)
    assert all(w["helper"] == 1 for w in one) and all(w["helper"] == 22 for w in two)
    assert all(w["env"] == {"PROBE_MARK": "one", "PROBE_ONLY_FIRST": "1"} for w in one)
    assert all(w["env"] == {"PROBE_MARK": "two"} for w in two)
    assert {w["cwd"] for w in one} == {str(job_dir)} and {w["cwd"] for w in two} == {str(elsewhere)}
    assert {w["umask"] for w in one} == {0o022} and {w["umask"] for w in two} == {0o077}
    assert {w["msgqueue"] for w in two} == {4096} and 4096 not in {w["msgqueue"] for w in one}
    assert {w["usr1"] for w in one} == {int(signal.SIG_DFL)}
    assert {w["usr1"] for w in two} == {int(signal.SIG_IGN)}
    assert {tuple(w["fds"]) for w in one} == {tuple(w["fds"]) for w in two}  # type: ignore[arg-type]
    # The workers are in their own agent's cgroups, not in the service's: the run's own
    # cgroup (v2 here, or v1 pids), and the v1 cgroup the second agent was started in.
    for result, workers in ((first, one), (second, two)):
        run = next(line for line in result.stderr.splitlines() if "run directory:" in line)
        name = Path(run.split("run directory: ", 1)[1]).name
        if os.geteuid() == 0 and hierarchies():  # where the agent makes its job cgroup
            assert all(f"/phalanx-{name}\n" in str(w["cgroup"]) for w in workers)
    if v1_cgroup is not None:
        assert all(f":cpu:/{v1_cgroup.name}\n" in str(w["cgroup"]) for w in two)
        assert not any(v1_cgroup.name in str(w["cgroup"]) for w in one)
    # Another preload list is another service; the first stays for its own launches.
    (job_dir / "mine.py").write_text("A = 1\n")
    preloaded = [*args, "--preload", "mine", "probe.py"]
    third = run_phalanx(preloaded, cwd=job_dir, timeout=HANG, env=dict(os.environ))
    assert third.returncode == 0, third.stderr
    (other,) = {w["ppid"] for w in seen(third.stdout)}
    assert other != service and sorted(service_pids(os.environ)) == sorted({service, other})
    # A preloaded module of one's own changed: a new service, and the stale one is stopped.
    (job_dir / "mine.py").write_text("A = 22\n")
    fourth = run_phalanx(preloaded, cwd=job_dir, timeout=HANG, env=dict(os.environ))
    assert fourth.returncode == 0, fourth.stderr
    (new,) = {w["ppid"] for w in seen(fourth.stdout)}
    assert new not in (service, other)
    wait_for(lambda: not alive(other), HANG, "the stale service to end")
    assert sorted(service_pids(os.environ)) == sorted({service, new})


# A python that another user may run (this one may be in root's home); stdlib only is used.
OTHER_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
def test_only_its_user_can_reach_a_service(job_dir: Path, tmp_path: Path) -> None:
    result = run_phalanx([*KEEP, "--log-dir", str(tmp_path), "probe.py"], cwd=job_dir, timeout=HANG)
    assert result.returncode == 0, result.stderr
    where = service_dir(os.environ)
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o700
    (path, *_) = sockets(where)
    probe = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); "
        "s.settimeout(20)\ntry:\n s.connect(sys.argv[1]); s.send(b'{\"status\": 1}'); "
        "print('answer', s.recv(65536))\nexcept OSError as e: print('refused', type(e).__name__)"
    )

    def nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)

    def as_nobody() -> str:
        out = subprocess.run([OTHER_PYTHON, "-I", "-c", probe, str(path)], preexec_fn=nobody,
                             capture_output=True, text=True, timeout=60, cwd="/")  # fmt: skip
        return out.stdout.strip()

    assert as_nobody() == "refused PermissionError"  # the 0700 directory
    # Opened up by mistake: the service still answers no one of another uid (SO_PEERCRED).
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in (where.parent, where, path)}
    for opened in (where.parent, where):
        os.chmod(opened, 0o711)
    os.chmod(path, 0o777)
    try:
        answer = as_nobody()
    finally:
        for each, mode in modes.items():
            os.chmod(each, mode)
    # closed on it: before its request was sent, before it was read, or with no answer
    assert answer in ("answer b''", "refused ConnectionResetError", "refused BrokenPipeError"), (
        answer
    )
    assert ask_all(os.environ, {"status": 1})  # and its own user still gets answers


def _two_nodes(
    job_dir: Path, tmp_path: Path, port: int, node: int, second: list[str] | None = None
) -> list[str]:
    """Node ``node``'s command of a 2-node job; node 0 keeps warm, node 1 ``second``."""
    return [
        *(KEEP if node == 0 else (second or ["--cold-start"])), "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "svc",
        "--rdzv-conf", f"{FAST},is_host={'true' if node == 0 else 'false'}",
        "--log-dir", str(tmp_path / f"n{node}"), "probe.py",
    ]  # fmt: skip


def test_a_service_killed_mid_launch_leaves_a_fresh_template_to_do_the_job(
    job_dir: Path, tmp_path: Path
) -> None:
    warm = run_phalanx([*KEEP, "--log-dir", str(tmp_path), "probe.py"], cwd=job_dir, timeout=HANG)
    assert warm.returncode == 0, warm.stderr
    port = free_port()
    with launched(_two_nodes(job_dir, tmp_path, port, 0), cwd=job_dir) as node0:
        # Node 0 has said hello to the service and waits in the rendezvous for node 1.
        def connected() -> bool:
            assert node0.poll() is None, node0.communicate()
            return any(node0.pid in a["agents"] for a in ask_all(os.environ, {"status": 1}))

        wait_for(connected, HANG, "node 0's session with the service")
        (service,) = [
            int(a["pid"]) for a in ask_all(os.environ, {"status": 1}) if node0.pid in a["agents"]
        ]
        os.kill(service, signal.SIGKILL)
        with launched(_two_nodes(job_dir, tmp_path, port, 1), cwd=job_dir) as node1:
            _, err1 = node1.communicate(timeout=HANG)
        out0, err0 = node0.communicate(timeout=HANG)
    assert node1.returncode == 0, err1
    assert node0.returncode == 0, err0
    falls = [line for line in err0.splitlines() if "warm service unavailable" in line]
    assert len(falls) == 1 and "workers fork from a fresh template" in falls[0], err0
    (forked,) = seen(out0)
    assert forked["ppid"] != service


def test_an_agent_killed_with_its_guardian_leaves_no_worker(job_dir: Path, tmp_path: Path) -> None:
    args = [*KEEP, "--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs"), "probe.py"]
    env = {**os.environ, "PROBE_SLEEP": "1"}
    with launched(args, cwd=job_dir, env=env) as agent:
        assert agent.stdout is not None
        workers = [json.loads(agent.stdout.readline().split("]: ", 1)[1]) for _ in range(2)]
        pids = [int(w["pid"]) for w in workers]  # type: ignore[call-overload]
        # The guardian would end them too: it goes first, then the agent, both by SIGKILL.
        for child in psutil.Process(agent.pid).children():
            if child.cmdline()[1:3] == ["-I", "-S"]:
                child.kill()
        agent.kill()
        agent.wait(HANG)
        try:
            wait_for(lambda: not any(alive(p) for p in pids), HANG, "the workers to be gone")
        finally:
            for pid in pids:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            remove_job_cgroups(tmp_path / "logs")
    assert service_pids(os.environ), "the service outlives the agent, for the next launch"
    assert all(a["jobs"] == a["workers"] == 0 for a in ask_all(os.environ, {"status": 1}))


def test_the_suite_leaves_no_service(job_dir: Path, tmp_path: Path) -> None:
    assert "PET_KEEP_WARM" not in os.environ  # no test gets a service unless it asks
    assert Path(os.environ["XDG_RUNTIME_DIR"]).name.startswith("phalanx-test-runtime-")
    if not service_pids(os.environ):  # run alone: make one
        result = run_phalanx([*KEEP, "--log-dir", str(tmp_path), "probe.py"], cwd=job_dir)
        assert result.returncode == 0, result.stderr
    pids = service_pids(os.environ)
    assert pids
    # Seen and stopped from the command line; then conftest's end (end_services) finds none.
    status = subprocess.run([*PHALANX, "service", "status"], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert status.returncode == 0 and all(f"\n{p} " in status.stdout for p in pids), status
    stop = subprocess.run([*PHALANX, "service", "stop"], capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr
    assert sorted(int(line.split()[2].rstrip(":")) for line in stop.stdout.splitlines()) == sorted(
        pids
    )
    wait_for(lambda: not any(alive(p) for p in pids), HANG, "the stopped services to end")
    assert end_services(os.environ) == [] and service_pids(os.environ) == []


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}  # no service there
    for args, said in (
        (["service", "restart"], "invalid choice: 'restart'"),
        (["--keep-warm", "-1", worker("service_probe.py")], "--keep-warm"),
        (["--keep-warm", "soon", worker("service_probe.py")], "--keep-warm"),
    ):
        done = subprocess.run(
            [*PHALANX, *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    for action in ("status", "stop"):
        done = subprocess.run([*PHALANX, "service", action], env=env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0 and "no warm service runs" in done.stderr, done.stderr


def test_each_node_forks_from_its_own_nodes_service(job_dir: Path, tmp_path: Path) -> None:
    # Two agents on this machine stand for two nodes: each has a runtime directory of its own,
    # as each node has its own filesystem, and the same key.
    homes = [tmp_path / f"node{i}" for i in (0, 1)]
    envs = [{**os.environ, "XDG_RUNTIME_DIR": str(home)} for home in homes]
    parents: list[set[object]] = []
    try:
        for home in homes:
            home.mkdir(mode=0o700)
        for _ in range(2):  # the first launch starts each node's service, the second reuses it
            port = free_port()
            with contextlib.ExitStack() as stack:
                nodes = [
                    stack.enter_context(launched(_two_nodes(job_dir, tmp_path, port, i, KEEP),
                                                 cwd=job_dir, env=envs[i]))
                    for i in (0, 1)
                ]  # fmt: skip
                done = [node.communicate(timeout=HANG) for node in nodes]
            assert [n.returncode for n in nodes] == [0, 0], [err for _, err in done]
            parents.append({seen(out)[0]["ppid"] for out, _ in done})
        services = [service_pids(env) for env in envs]
        assert all(len(pids) == 1 for pids in services), services  # one per node
        assert parents[0] == parents[1] == {services[0][0], services[1][0]}
    finally:
        for env in envs:
            end_services(env)
