"""Hosts for multi-node tests: network namespaces where they can be made, else loopback.

Both offer ``addr(i)`` (the address node i is reached at) and ``command(i, argv)`` (argv run
on node i), so a scenario is written once and runs on whichever is available.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


class Loopback:
    """Every "node" is this machine; nodes are told apart by their processes and ports."""

    kind = "loopback"

    def addr(self, i: int) -> str:
        return "127.0.0.1"

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def env(self) -> dict[str, str]:
        return {}


class NamespaceHosts:
    """Adapter over ``netns.NetNamespaces``: Gloo is pinned to each namespace's eth0, since a
    namespace's hostname resolves to the host's address, which its peers cannot reach."""

    kind = "netns"

    def __init__(self, spaces: object) -> None:
        self._spaces = spaces

    def addr(self, i: int) -> str:
        return str(self._spaces.addr(i))  # type: ignore[attr-defined]

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        return list(self._spaces.command(i, argv))  # type: ignore[attr-defined]

    def env(self) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": "eth0"}


class Node:
    """One phalanx agent on one host, its output in files so a test can read it while it runs;
    ``logs`` is its ``--log-dir``. ``kill`` ends its whole session (the ``nodes`` fixture calls it)."""

    def __init__(
        self,
        hosts: Loopback | NamespaceHosts,
        i: int,
        args: Sequence[str],
        tmp: Path,
        name: str = "",
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        subcommand: str = "",
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        """``cwd``: the agent's working directory (a checkout of its own); ``env``: variables
        set on top of the test's environment; ``subcommand``: run ``phalanx SUBCOMMAND``
        instead of a job (``check``); ``wrap``: what the host's command is run under (a
        CPU quota: ``cpuquota.CpuQuota.wrap``)."""
        name = name or f"n{i}"
        self.out, self.err, self.logs = (
            tmp / f"{name}.out",
            tmp / f"{name}.err",
            tmp / f"{name}-logs",
        )
        env = dict(os.environ, **hosts.env(), **(env or {}))
        argv = [
            sys.executable,
            "-m",
            "phalanx",
            *([subcommand] if subcommand else []),
            "--local-addr",
            hosts.addr(i),
            "--log-dir",
            str(self.logs),
            *args,
        ]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            command = hosts.command(i, argv)
            self.proc = subprocess.Popen(
                wrap(command) if wrap is not None else command,
                stdout=out,
                stderr=err,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )

    def finish(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout)

    @property
    def stdout(self) -> str:
        return self.out.read_text()

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
