"""Host lists (DeepSpeed's hostfile, Horovod's -H), the forwarded environment, and the
controller's command line: tables over the pure functions, and the real ``phalanx`` command
for what a user sees (one line, exit 2; ``--dry-run``)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from phalanx.config import HostSlots
from phalanx.hosts.hostfile import parse_hostfile_text, parse_hosts
from phalanx.hosts.plan import split_argv
from phalanx.hosts.remote_env import forwarded_env, read_env_file
from support.launch import run_phalanx, worker

REPO = Path(__file__).parents[2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("h1 slots=8\nh2 slots=4\n", [("h1", 8), ("h2", 4)]),
        ("# DeepSpeed\n\nworker-1 slots=2  # the first\n  worker-2\n", [("worker-1", 2), ("worker-2", 3)]),
        ("root@10.0.0.1 slots=1\n", [("root@10.0.0.1", 1)]),
    ],
)  # fmt: skip
def test_deepspeed_hostfile(text: str, expected: list[tuple[str, int]]) -> None:
    assert parse_hostfile_text(text, "hf", default_slots=3) == tuple(
        HostSlots(h, n) for h, n in expected
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("h1:8,h2:8", [("h1", 8), ("h2", 8)]),
        ("h1, h2:2", [("h1", 1), ("h2", 2)]),
        ("user@h1:4", [("user@h1", 4)]),
    ],
)
def test_horovod_hosts(text: str, expected: list[tuple[str, int]]) -> None:
    assert parse_hosts(text, default_slots=1) == tuple(HostSlots(h, n) for h, n in expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("h1 slots=2\nh2 gpus=2\n", "hf:2: expected 'slots=N' after the host, got 'gpus=2'"),
        ("h1 slots=0\n", "hf:1: expected a worker count of 1 or more, got '0'"),
        ("h1 slots=2 extra\n", "hf:1: expected 'host slots=N', got 'h1 slots=2 extra'"),
        ("-oProxyCommand=x slots=1\n", "hf:1: '-oProxyCommand=x' is not a host name"),
        ("h1\nh1\n", "hf: host 'h1' is listed twice"),
        ("# nothing\n", "hf: no hosts listed"),
    ],
)
def test_malformed_hostfile_lines_name_the_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_hostfile_text(text, "hf", default_slots=1)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("text", ["h1:x", "h1:0", ":2", "h1:2,h1:2"])
def test_malformed_hosts(text: str) -> None:
    with pytest.raises(ValueError, match="--hosts"):
        parse_hosts(text, default_slots=1)


def test_forwarded_env_defaults_names_and_file(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text("# extra\nWANDB_PROJECT=demo\nHF_HOME\n")
    environ = {"NCCL_DEBUG": "INFO", "PYTHONPATH": "src", "CUDA_VISIBLE_DEVICES": "0",
               "PET_NNODES": "2", "OMP_NUM_THREADS": "4", "HOME": "/root", "HF_HOME": "/hf",
               "MY_FLAG": "1", "PHALANX_RDZV_TOKEN": "inherited"}  # fmt: skip
    got = forwarded_env(environ, ["MY_FLAG"], read_env_file(env_file))
    assert got == {"CUDA_VISIBLE_DEVICES": "0", "HF_HOME": "/hf", "MY_FLAG": "1",
                   "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4", "PET_NNODES": "2",
                   "PYTHONPATH": "src", "WANDB_PROJECT": "demo"}  # fmt: skip
    with pytest.raises(ValueError, match=r"not set in this environment.*: NOPE"):
        forwarded_env(environ, ["NOPE"], [])


def test_controller_only_flags_are_not_passed_to_the_agents() -> None:
    argv = ["--hosts=h1:2", "--ssh-config", "cfg", "--env", "A", "--env_file", "f",
            "--dry-run", "--max-restarts", "1", "train.py", "--hosts", "x"]  # fmt: skip
    assert split_argv(argv, script_args=2) == (
        ["--max-restarts", "1"],
        ["train.py", "--hosts", "x"],
    )


def _phalanx(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    done = run_phalanx(list(args), cwd=tmp_path, env=env, timeout=60)
    return done.returncode, done.stdout, done.stderr


def test_missing_or_malformed_hostfile_is_one_line_and_exit_2(tmp_path: Path) -> None:
    script = worker("allreduce.py")
    code, _, err = _phalanx(tmp_path, "--hostfile", "absent.txt", script)
    assert (code, err) == (2, "phalanx: error: --hostfile absent.txt: cannot read it "
                              "(No such file or directory)\n")  # fmt: skip
    (tmp_path / "hosts.txt").write_text("h1 slots=2\n\nh2 slots=two\n")
    code, _, err = _phalanx(tmp_path, "--hostfile", "hosts.txt", script)
    assert (code, err) == (2, "phalanx: error: hosts.txt:3: expected 'slots=N' after the "
                              "host, got 'slots=two'\n")  # fmt: skip
    code, _, err = _phalanx(tmp_path, "--hosts", "h1:2", "--nnodes", "2", script)
    assert (code, err) == (2, "phalanx: error: --nnodes 2: at least 2 nodes, but the host list "
                              "has 1\n")  # fmt: skip


def test_dry_run_prints_every_host_command_and_the_forwarded_environment(tmp_path: Path) -> None:
    config = tmp_path / "ssh config"
    config.write_text("Host a\n  HostName 10.1.2.3\n  Port 2222\nHost b\n  HostName 10.1.2.4\n")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), NCCL_DEBUG="INFO",
               MY_API_KEY="hunter2", EXTRA="x y")  # fmt: skip
    done = run_phalanx(["--hosts", "a:2,b:1", "--ssh-config", str(config), "--env", "MY_API_KEY",
                        "--env", "EXTRA", "--dry-run", worker("allreduce.py"), "--lr", "0.1"],
                       cwd=tmp_path, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "2 hosts, 3 workers; rendezvous c10d at 10.1.2.3:29400 (hosted by a)" in out
    assert "  NCCL_DEBUG=INFO\n" in out and "  EXTRA=x y\n" in out
    assert "  MY_API_KEY=<secret>\n" in out and "hunter2" not in out
    assert "  PHALANX_RDZV_TOKEN=<secret>\n" in out
    commands = [line for line in out.splitlines() if line.startswith("  COMMAND: ")]
    assert len(commands) == 2
    assert all(f"cd {tmp_path} && exec {sys.executable} -I -S -c " in c for c in commands), commands
    for command, (addr, slots, host) in zip(
        commands, [("10.1.2.3", 2, "true"), ("10.1.2.4", 1, "false")], strict=True
    ):
        assert f"--nnodes 2 --nproc-per-node {slots} --rdzv-backend c10d --rdzv-endpoint 10.1.2.3:29400" in command  # fmt: skip
        assert f"--rdzv-conf is_host={host} --local-addr {addr} " in command
        assert command.endswith(f"{worker('allreduce.py')} --lr 0.1")
        assert "--hosts" not in command and "--dry-run" not in command
    ssh_lines = [line for line in out.splitlines() if line.startswith(("a: ssh", "b: ssh"))]
    assert ssh_lines == [
        f"a: ssh -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=1 -o ServerAliveCountMax=2 -F '{config}' -T a COMMAND",
        f"b: ssh -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=1 -o ServerAliveCountMax=2 -F '{config}' -T b COMMAND",
    ]


def test_dry_run_skips_an_excluded_host_and_the_next_host_takes_its_place(
    tmp_path: Path,
) -> None:
    """An exclusion file naming host b (by its address, as an agent writes it): b is not
    started, c takes its place; with a fourth host, d waits as a spare (beyond --nnodes 2)."""
    config = tmp_path / "ssh config"
    config.write_text(
        "".join(f"Host {h}\n  HostName 10.1.2.{i}\n" for i, h in enumerate("abcd", 3))
    )
    excluded = tmp_path / "excluded.jsonl"
    excluded.write_text('{"node": "x", "addr": "10.1.2.4", "reason": "root cause twice"}\n')
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    base = ["--hosts", "a:1,b:1,c:1", "--ssh-config", str(config), "--exclude-file", str(excluded),
            "--dry-run", worker("allreduce.py")]  # fmt: skip
    done = run_phalanx(["--nnodes", "2", *base], cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (
        f"phalanx: b (10.1.2.4) is not started: excluded in {excluded} (root cause twice)"
        in done.stdout
    )
    commands = [line for line in done.stdout.splitlines() if line.startswith("  COMMAND: ")]
    assert [line.split(": ")[0] for line in done.stdout.splitlines() if " ssh " in line] == [
        "a",
        "c",
    ]
    assert all("--nnodes 2 " in c for c in commands) and "--local-addr 10.1.2.5 " in commands[1]
    four = ["--hosts", "a:1,b:1,c:1,d:1", *base[2:]]
    done = run_phalanx(["--nnodes", "2", *four], cwd=tmp_path, env=env, timeout=60)
    assert "the last 1 host(s) started wait as spares" in done.stdout, done.stdout
    done = run_phalanx(["--nnodes", "3", *base], cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 2 and done.stderr == (
        f"phalanx: error: 2 host(s) left once those excluded in {excluded} are skipped (b); the "
        "job needs at least 3 (--nnodes): add hosts to the list, or remove a host's line from "
        "the exclusion file to let it in\n"
    ), done.stderr


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        (["--node-rank", "1"], "--node-rank"),
        (["--local-addr", "10.0.0.1"], "--local-addr"),
        (["--standalone"], "--standalone"),
        (["--rdzv-backend", "etcd"], "--rdzv-backend"),
    ],
)
def test_flags_the_host_list_sets_are_refused_with_it(flags: list[str], flag: str) -> None:
    from phalanx.cli.argv import parse_config
    from phalanx.errors import UsageError

    with pytest.raises(UsageError) as caught:
        parse_config(["--hosts", "h1:2", *flags, worker("allreduce.py")], {})
    assert f"{flag} cannot be used with --hosts/--hostfile: the host list sets it" in (
        caught.value.problems
    )


def test_dry_run_run_id_is_new_per_job_unless_given_and_the_endpoint_can_be_chosen(
    tmp_path: Path,
) -> None:
    def dry(*flags: str, full: bool = False) -> str:
        env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
        args = ["--hosts", "10.1.2.3:1,10.1.2.4:1", *flags, "--dry-run", worker("allreduce.py")]
        done = run_phalanx(args, cwd=tmp_path, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout if full else done.stdout.splitlines()[0]

    first, second = dry(), dry()
    assert first.split("run id ")[1] != second.split("run id ")[1]
    chosen = dry("--rdzv-id", "job42", "--rdzv-endpoint", "10.9.9.9:1234")
    assert (
        "c10d at 10.9.9.9:1234 (hosted by the agent on the machine it names), run id job42;"
        in chosen
    )
    assert "is_host" not in dry("--rdzv-endpoint", "10.9.9.9:1234", full=True)


BARRIER_SSH = """#!/bin/sh
# An ssh stand-in that runs the remote command here, but only once every host's pre-flight
# has reached it: a pre-flight that asked the hosts one after another would never get there.
while [ $# -gt 0 ]; do
    case "$1" in
        -o|-F) shift 2 ;;
        -G) echo "hostname 127.0.0.1"; exit 0 ;;
        -*) shift ;;
        *) break ;;
    esac
done
case "$2" in
    *phalanx.hosts.probe*) ;;
    *) echo "a stand-in: no agent runs here" >&2; exit 255 ;;
esac
touch "$BARRIER_DIR/$1"
tries=0
while [ "$(ls "$BARRIER_DIR" | wc -l)" -lt "$BARRIER_COUNT" ]; do
    tries=$((tries + 1))
    [ "$tries" -gt 600 ] && { echo "alone at the barrier" >&2; exit 255; }
    sleep 0.05
done
exec sh -c "$2"
"""


def test_preflight_asks_every_host_at_once(tmp_path: Path) -> None:
    bin_dir, barrier = tmp_path / "bin", tmp_path / "barrier"
    bin_dir.mkdir()
    barrier.mkdir()
    (bin_dir / "ssh").write_text(BARRIER_SSH)
    (bin_dir / "ssh").chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), BARRIER_DIR=str(barrier),
               BARRIER_COUNT="4", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
    script = tmp_path / "train.py"
    script.write_text("import sys; sys.exit(0)\n")
    done = run_phalanx(["--hosts", "a:1,b:1,c:1,d:1", "--rdzv-endpoint", "127.0.0.1:1",
                        str(script)], cwd=tmp_path, env=env, timeout=120)  # fmt: skip
    # Every probe passed; then the stand-in refuses to run the agents (exit 255, as a lost
    # connection): the controller says so, and with every session lost the job fails. (Four
    # c10d members may fail over, so a lost session no longer stops the others at once.)
    assert "pre-flight failed" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    assert re.search(r"the ssh session to [abcd] was lost", done.stderr), done.stderr
    assert sorted(p.name for p in barrier.iterdir()) == ["a", "b", "c", "d"]
