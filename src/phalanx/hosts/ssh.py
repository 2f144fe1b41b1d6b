"""Commands over the system's OpenSSH: ``ssh`` from PATH with ``BatchMode=yes`` (a prompt
would hang a job), the user's ssh config for ports, users and keys (``-F FILE`` with
``--ssh-config``).

Every remote command has the same shape: ``cd CWD && exec PYTHON -I -S -c BOOTSTRAP MODULE
ARGS``.
The bootstrap reads one JSON line from stdin (buffered: what it reads past the line is only
lifeline beats, which may be lost), the environment to add (the per-job secret
among it), and re-executes the same Python with it as ``python -m MODULE ARGS``: the
variables (``PYTHONPATH`` included) take effect before anything is imported, and none of
them appears on a command line. What follows on stdin is the lifeline (``hosts.lifeline``).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

# Kept free of phalanx imports: it runs before the forwarded PYTHONPATH is in effect.
BOOTSTRAP = (
    "import json,os,sys;"
    "l=sys.stdin.buffer.readline();"
    'l or sys.exit("phalanx: the controller sent no environment");'
    "os.environ.update(json.loads(l));"
    'os.execv(sys.executable,[sys.executable,"-m",*sys.argv[1:]])'
)

# The client gives up on a silent server within about 3 s (a cut link: two unanswered
# keepalives a second apart), as soon as the cut host's lifeline does (``lifeline.SILENCE``),
# so the controller stops the other hosts in time: the lifeline's SIGKILL ``HARD_STOP`` (5 s)
# later still falls within the 10 s the docs promise. (At 4 keepalives the other hosts were
# clean only after 9-10 s; a loaded machine went past 10.)
CLIENT_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=10",
    "-o", "ServerAliveInterval=1",
    "-o", "ServerAliveCountMax=2",
)  # fmt: skip


def ssh_argv(host: str, remote_command: str, ssh_config: Path | None) -> list[str]:
    config = ["-F", str(ssh_config)] if ssh_config is not None else []
    return ["ssh", *CLIENT_OPTIONS, *config, "-T", host, remote_command]


def remote_command(cwd: str, python: str, module: str, args: Sequence[str]) -> str:
    """The shell command line the remote login shell runs (no secrets in it)."""
    # -I -S: the bootstrap needs nothing but the standard library, so it skips site and the
    # user's PYTHON* variables (the re-executed Python gets them all).
    words = [python, "-I", "-S", "-c", BOOTSTRAP, module, *args]
    return f"cd {shlex.quote(cwd)} && exec {' '.join(shlex.quote(w) for w in words)}"


def env_line(env: Mapping[str, str]) -> bytes:
    """What the bootstrap reads first: one line of JSON."""
    return json.dumps(dict(env)).encode() + b"\n"


def resolve_address(host: str, ssh_config: Path | None, timeout: float = 10) -> str:
    """The address ssh connects to for ``host`` (``ssh -G``: aliases and HostName applied,
    nothing contacted). The rendezvous endpoint and each agent's ``--local-addr`` are these,
    so every agent is reached where ssh reached it, not where its hostname happens to resolve."""
    config = ["-F", str(ssh_config)] if ssh_config is not None else []
    try:
        done = subprocess.run(
            ["ssh", *config, "-G", host], capture_output=True, text=True, timeout=timeout
        )
    except FileNotFoundError:
        raise ValueError("--hosts/--hostfile: no 'ssh' command on PATH (install OpenSSH)") from None
    except subprocess.TimeoutExpired:
        raise ValueError(f"{host}: 'ssh -G' did not answer within {timeout:g} s") from None
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value:
            return value.strip()
    last = (done.stderr.strip().splitlines() or ["no hostname in its output"])[-1]
    raise ValueError(f"{host}: ssh cannot read its configuration: {last}")
