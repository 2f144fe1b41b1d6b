"""--hosts/--hostfile and the flags that go with them, read into the ``RemoteConfig``."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Mapping
from pathlib import Path

from phalanx import parsing
from phalanx.cli.problems import Problems
from phalanx.config import HostSlots, RemoteConfig


def remote_flags(
    ns: argparse.Namespace,
    environ: Mapping[str, str],
    p: Problems,
    nproc: int,
    given: Mapping[str, str],
) -> RemoteConfig:
    """--hosts/--hostfile and what goes with them (nothing when neither is given). ``given``:
    where each flag was set, so a refused one that came from ``PET_<FLAG>`` names it."""
    if ns.hosts is None and ns.hostfile is None:
        for flag, value in (("--ssh-config", ns.ssh_config), ("--env-file", ns.env_file)):
            if value is not None:
                p.add(f"{flag} applies only with --hosts or --hostfile")
        if ns.env:
            p.add("--env applies only with --hosts or --hostfile")
        return RemoteConfig()
    # Only a job over many hosts reads a host list: the package is not on a one-node launch's
    # path (``tests/cli/test_launch_imports.py``).
    from phalanx.hosts.hostfile import parse_hosts, read_hostfile
    from phalanx.hosts.remote_env import forwarded_env, read_env_file

    if ns.hosts is not None and ns.hostfile is not None:
        p.add("--hosts and --hostfile: give one of them")
    _refused_with_hosts(ns, p, given)
    no_hosts: tuple[HostSlots, ...] = ()
    if ns.hosts is not None:
        hosts = p.parse(lambda: parse_hosts(ns.hosts, nproc), no_hosts)
    else:
        hosts = p.parse(lambda: read_hostfile(Path(ns.hostfile), nproc), no_hosts)
    host_nodes = _host_nodes(ns, p, len(hosts), given)
    ssh_config = Path(ns.ssh_config) if ns.ssh_config is not None else None
    if ssh_config is not None and not ssh_config.is_file():
        p.add(f"--ssh-config: no such file: {ssh_config}")
    entries: list[tuple[str, str | None]] = []
    if ns.env_file is not None:
        entries = p.parse(lambda: read_env_file(Path(ns.env_file)), entries)
    no_env: dict[str, str] = {}
    env = p.parse(lambda: forwarded_env(environ, ns.env, entries), no_env)
    return RemoteConfig(hosts, host_nodes, ssh_config, tuple(env.items()))


def _refused_with_hosts(ns: argparse.Namespace, p: Problems, given: Mapping[str, str]) -> None:
    """The flags a host list sets itself, each refused when given (naming ``PET_<FLAG>``
    when it came from there)."""
    for refused, dest in (
        (ns.standalone, "standalone"),
        (str(ns.node_rank) != "0", "node_rank"),
        (ns.local_addr is not None, "local_addr"),
        ("rdzv_backend" in given, "rdzv_backend"),
    ):
        if refused:
            where = given.get(dest, f"PET_{dest.upper()}")
            came = "" if where == "the command line" else f" (it came from {where})"
            flag = "--" + dest.replace("_", "-")
            p.add(f"{flag} cannot be used with --hosts/--hostfile: the host list sets it{came}")


def _host_nodes(
    ns: argparse.Namespace, p: Problems, hosts: int, given: Mapping[str, str]
) -> tuple[int, int] | None:
    """With a host list, --nnodes MIN:MAX when given: the members; the hosts started beyond
    MAX wait as spares. None: every host started is a member."""
    host_nodes: tuple[int, int] | None = None
    if "nnodes" in given:
        with contextlib.suppress(ValueError):  # a bad value: said once, by _job's own parse
            host_nodes = parsing.parse_nnodes(ns.nnodes)
        if host_nodes is not None and hosts and host_nodes[0] > hosts:
            p.add(f"--nnodes {ns.nnodes}: at least {host_nodes[0]} nodes, but the host list "
                  f"has {hosts}")  # fmt: skip
    return host_nodes
