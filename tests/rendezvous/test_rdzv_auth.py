"""Real agents on a c10d job with a token, and the processes that try to get in.

Two rightful agents on loopback, one given the token by ``PHALANX_RDZV_TOKEN`` and one by
``--rdzv-conf token_file=``; the second starts on the same machine and so first tries to host
(the port is taken) and connects instead, which works only because the holder proves the
token. Meanwhile an agent with the wrong token is refused in one line, raw sockets send junk
and well-formed requests without the handshake, and torch's ``TCPStore`` client tries to
write the keys that would stop the job or make every rank dump its stacks. The job finishes
normally, the agents have no torch loaded, the store listens on 127.0.0.1 only, and the
token appears in no command line, worker environment, log, report or message.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from phalanx.rendezvous.dynamic.keys import Keys
from phalanx.rendezvous.stores.agentstore import auth, wire
from phalanx.resources.ports import free_port
from support.launch import PHALANX, run_phalanx, wait_for, worker

HANG = 120.0
RUN_ID = "auth"
KEYS = Keys(RUN_ID)


def _agent(
    endpoint: str, log: Path, work: Path, conf: str, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    args = ["--log-dir", str(log.with_suffix(".logs")), "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", RUN_ID,
            "--rdzv-conf", conf, worker("hold_until_go.py"), str(work)]  # fmt: skip
    with open(log, "wb") as err:
        return subprocess.Popen([*PHALANX, *args], stdout=err, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PHALANX_RDZV_TOKEN"}
    return {**env, **extra}


def _reachable(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _raw_intruder(port: int, payload: bytes) -> bytes:
    """What the store sends a raw peer that sends ``payload`` (the store closes on it)."""
    got = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(payload)
        while chunk := sock.recv(4096):
            got += chunk
    return bytes(got)


def _torch_intruder(port: int) -> subprocess.CompletedProcess[str]:
    script = (
        "import sys\nfrom datetime import timedelta\nfrom torch.distributed import TCPStore\n"
        "try:\n"
        f"    s = TCPStore('127.0.0.1', {port}, is_master=False, timeout=timedelta(seconds=2))\n"
        f"    s.set({KEYS.stopped!r}, b'1'); s.add({KEYS.round(0, 'stack_requests')!r}, 1)\n"
        "except Exception:\n    sys.exit(3)\n"
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=HANG)  # fmt: skip


def _intrude(port: int) -> None:
    attempts = [
        b"junk\r\n" * 10,
        wire.encode([wire.SET, KEYS.stopped.encode(), b"1"]),
        wire.encode([wire.ADD, KEYS.round(0, "stack_requests").encode(), b"1"]),
        wire.encode([wire.GET, KEYS.round(0, "master").encode()]),
        wire.encode([b"p" * 32, b"n" * 32]),  # a forged proof
    ]
    for payload in attempts:
        frames = wire.split_frames(bytearray(_raw_intruder(port, payload)), wire.MAX_FRAME)
        replies = [wire.decode(frame) for frame in frames]
        assert replies[0][0] == auth.GREETING and [r[0] for r in replies[1:]] == [wire.ERROR]
    assert _torch_intruder(port).returncode == 3


def _family(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _listeners(port: int) -> list[str]:
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.read().splitlines()[1:]]
    found = []
    for row in rows:
        hex_ip, hex_port = row[1].split(":")
        if row[3] == "0A" and int(hex_port, 16) == port:
            found.append(".".join(str(int(hex_ip[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def test_a_job_with_a_token_keeps_out_intruders_and_finishes(tmp_path: Path) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    (tmp_path / "token").write_text(secret + "\n")
    (tmp_path / "wrong").write_text("not-the-token\n")
    work = tmp_path / "work"
    work.mkdir()
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    conf = "join_timeout=60,last_call_timeout=1"
    host = _agent(
        endpoint, tmp_path / "host.out", work, conf, _environment(PHALANX_RDZV_TOKEN=secret)
    )
    procs = [host]
    try:
        wait_for(lambda: _reachable(port), HANG, "the host agent's store")
        # An agent with the wrong token: refused at the handshake, it never becomes a member.
        wrong = _agent(endpoint, tmp_path / "wrong.out", work, f"{conf},token_file={tmp_path / 'wrong'}",
                       _environment())  # fmt: skip
        procs.append(wrong)
        assert wrong.wait(HANG) == 1
        last = (tmp_path / "wrong.out").read_text().strip().splitlines()[-1]
        assert last.startswith(
            f"phalanx: --rdzv-backend c10d: the rendezvous store at {endpoint} refused this node"
        )
        assert "PHALANX_RDZV_TOKEN" in last and "token_file" in last
        _intrude(port)  # while the host waits for the second node
        client = _agent(endpoint, tmp_path / "client.out", work,
                        f"{conf},token_file={tmp_path / 'token'}", _environment())  # fmt: skip
        procs.append(client)
        wait_for(lambda: (work / "ready0").exists() and (work / "ready1").exists(), HANG,
                 "both workers")  # fmt: skip
        _intrude(port)  # while the workers run
        assert _listeners(port) == ["127.0.0.1"]
        for agent in (host, client):
            with open(f"/proc/{agent.pid}/maps") as maps:
                assert "libtorch" not in maps.read(), "the agent has torch loaded"
            for proc in _family(agent.pid):
                assert secret not in " ".join(proc.cmdline())
                if proc.pid != host.pid:  # the test gave the host agent the variable
                    assert secret not in "\0".join(f"{k}={v}" for k, v in proc.environ().items())
        (work / "go").touch()
        assert host.wait(HANG) == 0, (tmp_path / "host.out").read_text()
        assert client.wait(HANG) == 0, (tmp_path / "client.out").read_text()
        said = (tmp_path / "host.out").read_text()
        refusals = [line for line in said.splitlines() if "rendezvous store: refused" in line]
        assert len(refusals) == 1 and "127.0.0.1" in refusals[0], said
        assert "stack" not in said + (tmp_path / "client.out").read_text()  # no dumps asked
        for path in tmp_path.rglob("*"):
            if path.is_file() and path.name not in ("token",):
                assert secret.encode() not in path.read_bytes(), path
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.mark.parametrize("holder", ["raw junk", "torch TCPStore"])
def test_a_port_held_by_another_process_is_not_joined(tmp_path: Path, holder: str) -> None:
    """The would-be host finds the port taken and connects instead; the holder cannot prove
    the token, so the agent stops with one line naming the store, no traceback, no hang."""
    port = free_port()
    if holder == "raw junk":
        code = (
            "import socket, sys\ns = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])))\n"
            "s.listen()\nwhile True:\n    c, _ = s.accept(); c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\n')\n"
        )
    else:
        code = (
            "import sys, time\nfrom datetime import timedelta\nfrom torch.distributed import TCPStore\n"
            "s = TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False,"
            " timeout=timedelta(seconds=60))\ntime.sleep(120)\n"
        )
    squatter = subprocess.Popen([sys.executable, "-c", code, str(port)], start_new_session=True)
    try:
        wait_for(lambda: _reachable(port), HANG, "the squatter")
        done = run_phalanx(
            ["--log-dir", str(tmp_path / "logs"), "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", RUN_ID,
             "--rdzv-conf", "read_timeout=3", worker("chatty.py"), "1"],
            env=_environment(PHALANX_RDZV_TOKEN="secret"), timeout=HANG,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(
            f"phalanx: --rdzv-backend c10d: the rendezvous store at 127.0.0.1:{port}"
        )
        assert "handshake" in last and "Traceback" not in done.stderr
    finally:
        os.killpg(squatter.pid, signal.SIGKILL)
        squatter.wait(10)


def test_an_agent_does_not_trust_a_port_holder_that_fakes_the_servers_proof(
    tmp_path: Path,
) -> None:
    """The port is held by a process (``support/impostor.py``) that plays the store's side of
    the handshake and answers the agent's proof with "ok" and random bytes. The agent checks
    the server's proof: it stops with one line naming the store, exit 1, and the holder
    receives not one byte after the handshake (no ``set`` of this node's keys)."""
    port, record = free_port(), tmp_path / "after-handshake"
    impostor = Path(__file__).parents[1] / "support" / "impostor.py"
    squatter = subprocess.Popen([sys.executable, str(impostor), str(port), str(record)],
                                start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: _reachable(port), HANG, "the impostor")
        done = run_phalanx(
            ["--log-dir", str(tmp_path / "logs"), "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", RUN_ID,
             "--rdzv-conf", "read_timeout=3", worker("chatty.py"), "1"],
            env=_environment(PHALANX_RDZV_TOKEN="secret"), timeout=HANG,
        )  # fmt: skip
    finally:
        os.killpg(squatter.pid, signal.SIGKILL)
        squatter.wait(10)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"phalanx: --rdzv-backend c10d: the rendezvous store at 127.0.0.1:{port}"
    )
    assert "did not prove the job's rendezvous token" in last and "Traceback" not in done.stderr
    assert not record.exists(), record.read_bytes()


def test_the_token_is_never_on_the_command_line_nor_echoed(tmp_path: Path) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    done = run_phalanx(
        ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1",
         "--rdzv-conf", f"token={secret}", "--dry-run", worker("chatty.py")],
        env=_environment(), timeout=HANG,
    )  # fmt: skip
    assert done.returncode == 2 and secret not in done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert (
        "--rdzv-conf token:" in line and "token_file=PATH" in line and "PHALANX_RDZV_TOKEN" in line
    )
    token_file = tmp_path / "token"
    token_file.write_text(secret)
    dry = run_phalanx(
        ["--nnodes", "2", "--rdzv-backend", "static", "--node-rank", "0", "--master-addr", "10.1.2.3",
         "--rdzv-conf", f"token_file={token_file}", "--dry-run", worker("chatty.py")],
        env=_environment(PHALANX_RDZV_TOKEN=secret), timeout=HANG,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert secret not in dry.stdout + dry.stderr
    assert "  PHALANX_RDZV_TOKEN not passed on" in dry.stdout.splitlines()


def _c10d_args(tmp_path: Path, endpoint: str, conf: str, nnodes: str = "2") -> list[str]:
    return ["--log-dir", str(tmp_path / "logs"), "--nnodes", nnodes, "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", RUN_ID,
            "--rdzv-conf", conf, worker("chatty.py"), "1"]  # fmt: skip


_COMMAND_LINE = "--rdzv-conf token: the rendezvous token is never given on the command line"


@pytest.mark.parametrize(
    ("nnodes", "conf", "says"),
    [
        ("2", "token=abc", _COMMAND_LINE),
        ("1", "token=abc", _COMMAND_LINE),
        (
            "2",
            "token_file={missing}",
            "--rdzv-conf token_file={missing}: cannot read it (No such file",
        ),
        ("2", "token_file={empty}", "--rdzv-conf token_file={empty}: the file is empty"),
    ],
    ids=["token on the command line", "the same on one node", "missing file", "empty file"],
)
def test_a_bad_token_setting_is_one_line_and_exit_2(
    tmp_path: Path, nnodes: str, conf: str, says: str
) -> None:
    """One node has no store, but ``token=`` is refused there too: ps would show it all the
    same."""
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty"}
    paths["empty"].write_text("\n")
    conf, says = conf.format(**paths), says.format(**paths)
    done = run_phalanx(_c10d_args(tmp_path, "127.0.0.1:1", conf, nnodes), env=_environment(),
                       timeout=HANG)  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert says in line and "abc" not in line and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("endpoint", "token", "warned"),
    [("10.213.255.1", None, True), ("10.213.255.1", "secret", False), ("127.0.0.1", None, True)],
    ids=["no token, other machines", "a token", "loopback (any local process reaches it)"],
)
def test_an_agent_the_user_started_without_a_token_says_so_once(
    tmp_path: Path, endpoint: str, token: str | None, warned: bool
) -> None:
    """The agent is told not to host (is_host=false) and gives up after join_timeout: what
    matters is what it says at start."""
    env = _environment(**({"PHALANX_RDZV_TOKEN": token} if token else {}))
    done = run_phalanx(
        _c10d_args(tmp_path, f"{endpoint}:{free_port()}", "is_host=false,join_timeout=1"),
        env=env, timeout=HANG,
    )  # fmt: skip
    assert done.returncode == 1
    warnings = [line for line in done.stderr.splitlines() if "has no token" in line]
    assert len(warnings) == (1 if warned else 0), done.stderr
    if warned:
        assert "PHALANX_RDZV_TOKEN" in warnings[0] and "token_file=PATH" in warnings[0]
        assert "take node rank 0" in warnings[0] and "--hosts/--hostfile" in warnings[0]


def test_a_static_job_shares_the_token_and_its_agents_have_no_torch(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    port = free_port()
    env = _environment(PHALANX_RDZV_TOKEN=f"s3cr3t-{uuid.uuid4().hex}")
    agents = []
    try:
        for rank in (0, 1):
            args = ["--log-dir", str(tmp_path / f"n{rank}.logs"), "--nnodes", "2",
                    "--nproc-per-node", "1", "--rdzv-backend", "static", "--node-rank", str(rank),
                    "--master-addr", "127.0.0.1", "--master-port", str(port),
                    worker("hold_until_go.py"), str(work)]  # fmt: skip
            with open(tmp_path / f"n{rank}.out", "wb") as out:
                agents.append(subprocess.Popen([*PHALANX, *args], stdout=out, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True))  # fmt: skip
        wait_for(lambda: (work / "ready0").exists() and (work / "ready1").exists(), HANG,
                 "both workers")  # fmt: skip
        assert _listeners(port) == ["127.0.0.1"]
        for agent in agents:
            with open(f"/proc/{agent.pid}/maps") as maps:
                assert "libtorch" not in maps.read(), "the agent has torch loaded"
        (work / "go").touch()
        for rank, agent in enumerate(agents):
            assert agent.wait(HANG) == 0, (tmp_path / f"n{rank}.out").read_text()
    finally:
        for proc in agents:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
