"""torchrun 2.13's defaults are phalanx's: its own parser and its own ``run()`` are the
reference (tests only; phalanx never imports them), and the classic static command runs on
two real hosts (``test_static_classic.py``). The deliberate differences are the docs' table,
``DIFFERENCES`` below, one test per row."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import run as torchrun

from phalanx.cli.argv import expanded
from phalanx.cli.convert import to_config
from phalanx.cli.parser import build_parser
from phalanx.cli.scheduler import Derivation, given_flags
from phalanx.config import LaunchConfig
from support.launch import worker

SCRIPT = worker("echo_args.py")


@pytest.fixture(autouse=True)
def no_pet(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PET_") or name == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT":
            monkeypatch.delenv(name)


def ours(argv: list[str], env: dict[str, str] | None = None) -> LaunchConfig:
    """phalanx's config for ``argv``, as the CLI builds it (no scheduler)."""
    env = {"PATH": os.environ.get("PATH", ""), **(env or {})}
    argv = expanded([*argv, SCRIPT], env)
    ns = build_parser(env).parse_args(argv)
    return to_config(ns, env, lambda: 0, Derivation(given=given_flags(argv, env)))


def theirs(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """torchrun's LaunchConfig for ``argv``: its own ``run()``, with the launch itself (the
    one call that would start anything) replaced by a recorder."""
    seen: list[Any] = []

    def launch(config: Any, entrypoint: Any) -> Any:
        seen.append(config)
        return lambda *args: None

    monkeypatch.setattr(torchrun, "elastic_launch", launch)
    torchrun.run(torchrun.get_args_parser().parse_args([*argv, SCRIPT]))
    return seen[0]


def _normal(dest: str, value: Any) -> Any:
    """A parsed default as a value (torchrun types some options; phalanx keeps strings)."""
    if dest == "nnodes":
        return torchrun.parse_min_max_nnodes(str(value))
    if dest.startswith("duplicate_"):
        return list(value) if isinstance(value, list) else [w for w in value.split(",") if w]
    return value if value is None or isinstance(value, bool) else str(value)


def test_every_default_is_torchruns() -> None:
    """Every torchrun option, no flag given: the same default (after torchrun's own typing)."""
    torch_ns = torchrun.get_args_parser().parse_args([SCRIPT])
    our_ns = build_parser({}).parse_args([SCRIPT])
    dests = [a.dest for a in torchrun.get_args_parser()._actions if a.option_strings]
    differ = {
        dest: (getattr(torch_ns, dest), getattr(our_ns, dest))
        for dest in dests
        if dest != "help"
        and _normal(dest, getattr(torch_ns, dest)) != _normal(dest, getattr(our_ns, dest))
    }
    assert differ == {}, f"(torchrun, phalanx) defaults that differ: {differ}"


def _endpoint(config: LaunchConfig) -> str:
    """Where phalanx's nodes meet, in torchrun's words."""
    if config.rendezvous.rdzv_backend == "static":
        return f"{config.rendezvous.master_addr}:{config.rendezvous.master_port}"
    if not config.rendezvous.is_multi_node and not config.rendezvous.rdzv_endpoint:
        return "localhost:0"  # one node: a local rendezvous on a free port, as torchrun's
    return config.rendezvous.rdzv_endpoint


CASES = [
    [],
    ["--nproc-per-node", "2"],
    ["--master-port", "29511"],
    ["--nnodes", "2"],
    ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500"],
    ["--nnodes", "2", "--rdzv-endpoint", "10.0.0.9:29401"],
    ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400"],
    ["--standalone", "--nproc-per-node", "2"],
]


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c) or "(none)" for c in CASES])
def test_the_rendezvous_is_torchruns(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend, the endpoint the nodes meet at, the node count and rank: what torchrun's
    own ``run()`` hands its agent, for the same command line."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # torchrun's run() would set it in os.environ
    them, us = theirs(argv, monkeypatch), ours(argv)
    assert (us.rendezvous.rdzv_backend, _endpoint(us)) == (them.rdzv_backend, them.rdzv_endpoint)
    assert (us.rendezvous.min_nodes, us.rendezvous.max_nodes, us.workers.nproc_per_node, us.recovery.max_restarts) == (
        them.min_nodes, them.max_nodes, them.nproc_per_node, them.max_restarts
    )  # fmt: skip
    if us.rendezvous.rdzv_backend == "static":
        assert us.rendezvous.node_rank == them.rdzv_configs["rank"]
    assert (us.workers.role, us.workers.monitor_interval, us.workers.start_method) == (
        them.role, them.monitor_interval, them.start_method
    )  # fmt: skip
    assert ",".join(us.workers.signals_to_handle) == them.signals_to_handle


# The table of deliberate differences (docs/tutorials/from-torchrun.md, "Where phalanx
# differs from torchrun on purpose"): row -> the test that holds it.
DIFFERENCES = {
    "shutdown timeout": "test_shutdown_timeout_is_5_s_unless_torchrun_s_variable_says",
    "console prefix": "tests/cli/test_torchrun_gaps.py::test_every_console_line_carries_its_rank_once",
    "rdzv-conf keys": "tests/cli/test_torchrun_gaps.py::test_a_misspelt_rdzv_conf_key_is_refused_on_one_node",
    "abbreviations": "tests/cli/test_torchrun_gaps.py::test_abbreviations_stop_at_the_script",
    "logs-specs": "tests/cli/test_torchrun_gaps.py::test_logs_specs_default_runs_and_unknown_is_refused",
    "another run id": "tests/rendezvous/test_shared_endpoint.py::test_another_run_id_on_a_running_jobs_endpoint_is_refused_and_the_job_finishes",
    "script arguments": "tests/multinode/test_multinode_consistency.py::test_script_arguments_that_differ_run_as_under_torchrun_and_are_named",
    "another script": "tests/rendezvous/test_shared_endpoint.py::test_the_same_run_id_with_another_script_is_refused_before_the_job_hears_of_it",
    "per-node arguments": "tests/rendezvous/test_shared_endpoint.py::test_two_launches_with_other_script_arguments_form_one_world",
}


def test_every_difference_row_has_its_test() -> None:
    readme = (Path(__file__).parents[2] / "docs" / "tutorials" / "from-torchrun.md").read_text()
    here = Path(__file__).parents[1]
    for row, test in DIFFERENCES.items():
        assert f"`{test.rpartition('::')[2] if '::' in test else test}`" in readme, row
        path, _, name = test.rpartition("::")
        text = (here.parent / path).read_text() if path else Path(__file__).read_text()
        assert f"def {name or test}(" in text, test


def test_shutdown_timeout_is_5_s_unless_torchrun_s_variable_says() -> None:
    """torchrun: --shutdown-timeout, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s. phalanx
    reads the same two, then 5 s: a failed group is stopped sooner."""
    assert ours([]).workers.shutdown_timeout == 5.0
    assert ours([], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "12"}).workers.shutdown_timeout == 12.0
    assert (
        ours(
            ["--shutdown-timeout", "7"], {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "12"}
        ).workers.shutdown_timeout
        == 7.0
    )


def test_the_usage_line_lists_every_subcommand() -> None:
    from phalanx.cli.main import SUBCOMMANDS
    from phalanx.cli.usage import SUBCOMMAND_NAMES, USAGE

    assert sorted(SUBCOMMAND_NAMES) == sorted(SUBCOMMANDS)
    assert "{" + ",".join(SUBCOMMAND_NAMES) + "}" in USAGE
