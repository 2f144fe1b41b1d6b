"""torchrun's own parser is the reference for every flag, in every spelling it accepts.

The table below has a row per option of ``torch.distributed.run.get_args_parser()`` (a new
torchrun flag fails ``test_every_torchrun_option_has_a_row`` until it gets one). Each row gives
a valid sample value; the sample is parsed by torchrun's parser and by phalanx's
(``build_parser`` then ``to_config``), under each spelling and from ``PET_<DEST>``, and the
value torchrun parsed (put through torchrun's own helpers where torchrun converts it further)
is compared with what phalanx's ``LaunchConfig`` holds. The flags phalanx accepts but does not
carry out are run through the real CLI.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing import Std

from phalanx.cli.convert import to_config
from phalanx.cli.parser import build_parser
from phalanx.config import LaunchConfig, LaunchMode, WorkersConfig
from support.launch import PHALANX, worker

SCRIPT = worker("echo_args.py")
Seen = Callable[[argparse.Namespace], Any]  # torchrun's value, from its Namespace
Held = Callable[[LaunchConfig, argparse.Namespace], Any]  # phalanx's, from config (or Namespace)


@dataclass(frozen=True)
class Row:
    sample: str | None  # None: a switch
    theirs: Seen
    ours: Held
    extra: tuple[str, ...] = ()  # other flags the sample needs to be valid
    program: str = SCRIPT


_STREAMS = {
    Std.NONE: frozenset(),
    Std.OUT: frozenset({"stdout"}),
    Std.ERR: frozenset({"stderr"}),
    Std.ALL: frozenset({"stdout", "stderr"}),
}


def std_streams(text: str, nproc: int) -> dict[int, frozenset[str]]:
    """torchrun's ``Std.from_str`` as phalanx keeps it: local rank -> streams, empty left out."""
    spec = Std.from_str(text)
    per_rank = spec if isinstance(spec, dict) else dict.fromkeys(range(nproc), spec)
    return {rank: _STREAMS[std] for rank, std in per_rank.items() if std is not Std.NONE}


def attr(name: str) -> Held:
    return lambda config, ns: attrgetter(name)(config)


def same(name: str) -> Seen:
    return lambda ns: getattr(ns, name)


ROWS: dict[str, Row] = {
    "nnodes": Row("2:4", lambda ns: torchrun.parse_min_max_nnodes(ns.nnodes),
                  lambda c, ns: (c.rendezvous.min_nodes, c.rendezvous.max_nodes), extra=("--rdzv-backend", "c10d")),
    "nproc_per_node": Row("3", lambda ns: torchrun.determine_local_world_size(ns.nproc_per_node),
                          attr("workers.nproc_per_node")),
    "rdzv_backend": Row("etcd-v2", same("rdzv_backend"), attr("rendezvous.rdzv_backend"),
                        extra=("--rdzv-endpoint", "localhost:2379")),
    "rdzv_endpoint": Row("node0.example:29400", same("rdzv_endpoint"), attr("rendezvous.rdzv_endpoint")),
    "rdzv_id": Row("job-7", same("rdzv_id"), attr("rendezvous.rdzv_id")),
    "rdzv_conf": Row("join_timeout=60,last_call_timeout=5",
                     lambda ns: torchrun._parse_rendezvous_config(ns.rdzv_conf),
                     lambda c, ns: dict(c.rendezvous.rdzv_conf)),
    "standalone": Row(None, same("standalone"), attr("rendezvous.standalone")),
    "max_restarts": Row("3", same("max_restarts"), attr("recovery.max_restarts")),
    "monitor_interval": Row("0.5", same("monitor_interval"), attr("workers.monitor_interval")),
    "start_method": Row("fork", same("start_method"), attr("workers.start_method")),
    # Namespace only: phalanx keeps no event log (null or console accepted, nothing else).
    "event_log_handler": Row("console", same("event_log_handler"),
                             lambda c, ns: ns.event_log_handler),
    "role": Row("trainer", same("role"), attr("workers.role")),
    "module": Row(None, same("module"), lambda c, ns: c.workers.mode is LaunchMode.MODULE,
                  program="json.tool"),
    "no_python": Row(None, same("no_python"), lambda c, ns: c.workers.mode is LaunchMode.NO_PYTHON,
                     program="true"),
    "run_path": Row(None, same("run_path"), lambda c, ns: c.workers.mode is LaunchMode.RUN_PATH),
    "log_dir": Row("/tmp/some dir/logs", lambda ns: Path(ns.log_dir), attr("logs.log_dir")),
    "redirects": Row("0:1,1:3", lambda ns: std_streams(ns.redirects, 2), attr("logs.redirects"),
                     extra=("--nproc-per-node", "2")),
    # Parsed and checked, then unused: phalanx always tees to the log files.
    "tee": Row("0:2,1:3", lambda ns: std_streams(ns.tee, 2), lambda c, ns: std_streams(ns.tee, 2),
               extra=("--nproc-per-node", "2")),
    # torchrun's config_from_args: set(map(int, value.split(","))).
    "local_ranks_filter": Row("0,2", lambda ns: set(map(int, ns.local_ranks_filter.split(","))),
                              attr("logs.local_ranks_filter"), extra=("--nproc-per-node", "3")),
    "duplicate_stdout_filters": Row("loss,,x,step", same("duplicate_stdout_filters"),
                                    lambda c, ns: list(c.logs.duplicate_stdout_filters)),
    "duplicate_stderr_filters": Row("error,warn", same("duplicate_stderr_filters"),
                                    lambda c, ns: list(c.logs.duplicate_stderr_filters)),
    "node_rank": Row("1", same("node_rank"), attr("rendezvous.node_rank"), extra=("--nnodes", "2")),
    "master_addr": Row("10.1.2.3", same("master_addr"), attr("rendezvous.master_addr")),
    "master_port": Row("29601", same("master_port"), attr("rendezvous.master_port")),
    "local_addr": Row("10.0.0.5", same("local_addr"), attr("rendezvous.local_addr")),
    # Not carried out (test_not_applied_flags_through_the_cli): parsed the same, then an
    # unregistered --logs-specs is refused (as torchrun) and --numa-binding warns.
    "logs_specs": Row("my.plugin", same("logs_specs"), lambda c, ns: ns.logs_specs),
    "numa_binding": Row("socket", same("numa_binding"), lambda c, ns: ns.numa_binding),
    "signals_to_handle": Row("SIGTERM,SIGUSR1", lambda ns: ns.signals_to_handle.split(","),
                             lambda c, ns: list(c.workers.signals_to_handle)),
    "shutdown_timeout": Row("7", same("shutdown_timeout"), attr("workers.shutdown_timeout")),
    "virtual_local_rank": Row(None, same("virtual_local_rank"), attr("workers.virtual_local_rank")),
}  # fmt: skip
REFUSED = {"logs_specs"}  # my.plugin is registered nowhere: refused (checked through the CLI)


def torchrun_options() -> list[argparse.Action]:
    return [a for a in torchrun.get_args_parser()._actions if a.option_strings and a.dest != "help"]


def spellings() -> Iterator[tuple[str, str]]:
    for action in torchrun_options():
        for flag in action.option_strings:
            yield action.dest, flag


@pytest.fixture(autouse=True)
def no_pet(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's parser reads ``PET_*`` from os.environ when built: none may leak in."""
    for name in list(os.environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)


def environ(**pet: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), **pet}


def parse_both(argv: list[str], env: dict[str, str], dest: str) -> tuple[Any, Any]:
    row = ROWS[dest]
    theirs = torchrun.get_args_parser().parse_args(argv)
    ns = build_parser(env).parse_args(argv)
    if dest in REFUSED:
        return row.theirs(theirs), row.ours(LaunchConfig(WorkersConfig(program=row.program)), ns)
    return row.theirs(theirs), row.ours(to_config(ns, env, lambda: 0), ns)


def test_every_torchrun_option_has_a_row() -> None:
    assert sorted(a.dest for a in torchrun_options()) == sorted(ROWS)
    ours = {flag for a in build_parser({})._actions for flag in a.option_strings}
    missing = {flag for _, flag in spellings()} - ours
    assert not missing, f"torchrun spellings phalanx does not accept: {sorted(missing)}"


@pytest.mark.parametrize(("dest", "flag"), list(spellings()), ids=[f for _, f in spellings()])
def test_flag_parses_as_torchrun_parses_it(dest: str, flag: str) -> None:
    row = ROWS[dest]
    given = [flag] if row.sample is None else [flag, row.sample]
    theirs, ours = parse_both([*row.extra, *given, row.program], environ(), dest)
    assert theirs == ours, f"{flag} {row.sample}: torchrun {theirs!r}, phalanx {ours!r}"
    assert not_default(dest, given)


def not_default(dest: str, given: list[str]) -> bool:
    """The sample is not torchrun's default (else the row would prove nothing)."""
    row = ROWS[dest]
    parser = torchrun.get_args_parser()
    default = getattr(parser.parse_args([*row.extra, row.program]), dest)
    return bool(getattr(parser.parse_args([*row.extra, *given, row.program]), dest) != default)


ENV_ACTIONS = [a.dest for a in torchrun_options() if type(a).__name__ in ("env", "check_env")]


@pytest.mark.parametrize("dest", ENV_ACTIONS)
def test_pet_fallback_as_torchrun_reads_it(dest: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PET_<DEST>`` in the environment stands in for the flag, for every flag torchrun reads
    that way (its ``env`` and ``check_env`` actions, which read os.environ when built)."""
    row = ROWS[dest]
    name, value = f"PET_{dest.upper()}", "1" if row.sample is None else row.sample
    monkeypatch.setenv(name, value)
    theirs, ours = parse_both([*row.extra, row.program], environ(**{name: value}), dest)
    assert theirs == ours, f"{name}={value}: torchrun {theirs!r}, phalanx {ours!r}"
    monkeypatch.delenv(name)
    assert not_default(dest, [f"--{dest}"] if row.sample is None else [f"--{dest}", row.sample])


def test_pet_is_ignored_where_torchrun_ignores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's plain ``store`` options read no ``PET_*`` variable; phalanx's neither."""
    plain = [a.dest for a in torchrun_options() if a.dest not in ENV_ACTIONS]
    assert sorted(plain) == ["logs_specs", "numa_binding"]  # as of torch 2.13
    for dest in plain:
        name, value = f"PET_{dest.upper()}", str(ROWS[dest].sample)
        monkeypatch.setenv(name, value)
        theirs, ours = parse_both([SCRIPT], environ(**{name: value}), dest)
        assert theirs is None and ours is None, f"{name}: torchrun {theirs!r}, phalanx {ours!r}"


def cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PHALANX, "--log-dir", str(tmp_path), *args],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize("flag", ["--logs-specs", "--logs_specs"])
def test_an_unregistered_logs_specs_is_refused_as_torchrun_refuses_it(
    flag: str, tmp_path: Path
) -> None:
    done = cli([flag, "my.plugin", SCRIPT], tmp_path)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "phalanx: error: --logs-specs: could not find entrypoint under "
        "'torchrun.logs_specs[my.plugin]' key (registered: default)"
    ]


@pytest.mark.parametrize("flag", ["--event-log-handler", "--event_log_handler"])
def test_event_log_handler_takes_null_or_console(flag: str, tmp_path: Path) -> None:
    done = cli([flag, "dynamic_rendezvous", SCRIPT], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "phalanx: error: --event-log-handler: expected null or console, got 'dynamic_rendezvous'"
    ]
    ran = cli([flag, "console", SCRIPT, "hello"], tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "hello" in ran.stdout


@pytest.mark.parametrize("flag", ["--numa-binding", "--numa_binding"])
def test_numa_binding_runs_and_warns_in_one_line(flag: str, tmp_path: Path) -> None:
    done = cli([flag, "exclusive", SCRIPT, "hello"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hello" in done.stdout
    (warning,) = [line for line in done.stderr.splitlines() if "--numa-binding" in line]
    assert "--numa-binding exclusive is not applied" in warning and "numactl" in warning
