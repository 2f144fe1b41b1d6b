"""The one call both faces (the CLI and ``phalanx.spawn``) make: ``prepare(config).run(env)``.

``prepare(config)`` validates the rendezvous part and returns a ``Launch``: the run id, how
to open this node's rendezvous (not opened yet: the agent does that, after its guardian and
template are up), the plan ``--dry-run`` prints, and ``run``: this node's agent.
``check_launch(config)`` is the same, returning the problems instead, for the CLI to report
with its own in one batch. Either checks the rendezvous once: what it parsed (endpoint,
token, settings) is what the backend opens with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx.config import LaunchConfig, RendezvousConfig
from phalanx.errors import UsageError
from phalanx.plan import RoundPlan, build_plan
from phalanx.rendezvous.api import NodeInfo, RendezvousHandler, RendezvousResult
from phalanx.rendezvous.local import LocalRendezvous, random_run_id
from phalanx.rendezvous.registry import backend_problem, check, conf_keys, open_handler
from phalanx.rendezvous.settings import settings_problems
from phalanx.rendezvous.stores.agentstore.conf import TOKEN_FILE_KEY, token_from_conf

# A one-node launch hashes no code and opens no store: the fingerprint (hashlib) and the
# rendezvous spec are imported for many nodes only.
if TYPE_CHECKING:
    from phalanx.consistency.fingerprint import Target
    from phalanx.rendezvous.spec import RendezvousSpec


@dataclass(frozen=True)
class Launch:
    config: LaunchConfig
    run_id: str
    open_rendezvous: Callable[[], RendezvousHandler]

    def run(self, environ: Mapping[str, str], *, contain: bool = False) -> int:
        """This node's part of the job, to its end: the exit code (``contain``: the job in a
        cgroup of its own where one can be made -- the CLI's, not ``phalanx.spawn``'s agent,
        which is the user's own process)."""
        from phalanx.agent import Agent  # the agent's modules only where a node runs

        agent = Agent(self.config, self.open_rendezvous, self.run_id, environ, contain=contain)
        return agent.run()

    def dry_run_plan(self, environ: Mapping[str, str]) -> RoundPlan:
        """This node's plan without meeting anyone: every node is assumed to have this
        node's worker count; the master port is shown as 0 (chosen per round)."""
        nodes = self.config.rendezvous
        node_rank = nodes.node_rank if nodes.is_multi_node else 0
        nodes_info = tuple(
            NodeInfo(rank, "<host>", "<addr>", self.config.workers.nproc_per_node)
            for rank in range(max(nodes.max_nodes, node_rank + 1))
        )
        master = "localhost"
        if nodes.is_multi_node:
            master = nodes.master_addr if nodes.rdzv_backend == "static" else "<rendezvous>"
        result = RendezvousResult(self.run_id, 0, 0, node_rank, nodes_info, master, 0)
        return build_plan(self.config, result, Path("<run directory>"), environ)


def rendezvous_spec(
    nodes: RendezvousConfig, allow_mismatch: bool, max_restarts: int = 0
) -> RendezvousSpec:
    """The rendezvous record as the backends take it (``allow_mismatch``: the nodes' code
    may differ, a check the rendezvous makes; ``max_restarts``: the job's budget, which a
    node waiting to join spends when every member of the running round is gone)."""
    from phalanx.rendezvous.spec import RendezvousSpec  # a store's rendezvous: many nodes

    return RendezvousSpec(
        backend=nodes.rdzv_backend,
        run_id=nodes.rdzv_id,
        min_nodes=nodes.min_nodes,
        max_nodes=nodes.max_nodes,
        endpoint=nodes.rdzv_endpoint,
        conf=nodes.rdzv_conf_dict,
        node_rank=nodes.node_rank if nodes.rdzv_backend == "static" else None,
        master_addr=nodes.master_addr,
        master_port=nodes.master_port,
        local_addr=nodes.local_addr,
        worker_port=nodes.worker_port,
        allow_mismatch=allow_mismatch,
        max_restarts=max_restarts,
    )


def check_launch(
    config: LaunchConfig, checked: Target | None = None
) -> tuple[Launch | None, list[str]]:
    """The launch, or every usage problem of its rendezvous part (nothing is contacted):
    the one check per launch, whose parsed options the launch opens the rendezvous with.
    One node needs no store, so only the backend's name, the run id and the rendezvous
    settings are checked there (a bad value or an unknown key is refused wherever the job
    runs). ``checked``: as ``prepare``'s."""
    if not config.rendezvous.is_multi_node:
        problems = _one_node_problems(config.rendezvous)
        return (None if problems else _one_node(config)), problems
    spec = rendezvous_spec(
        config.rendezvous, config.checks.allow_mismatch, config.recovery.max_restarts
    )
    rendezvous = check(spec)
    if rendezvous.problems:
        return None, rendezvous.problems
    from phalanx.consistency.fingerprint import node_fingerprint, target_of

    target = checked or target_of(config.workers)

    def open_multi_node() -> RendezvousHandler:
        # Hashed when the agent opens the rendezvous (never for --dry-run).
        return open_handler(rendezvous, node_fingerprint(target))

    return Launch(config, config.rendezvous.rdzv_id, open_multi_node), []


def prepare(config: LaunchConfig, checked: Target | None = None) -> Launch:
    """Raises ``UsageError`` listing every rendezvous problem. ``checked``: the program
    whose content the nodes compare (default: the config's own; ``phalanx.spawn`` names the
    user's script, since its workers run phalanx's entry point)."""
    launch, problems = check_launch(config, checked)
    if launch is None:
        raise UsageError(problems)
    return launch


def _one_node_problems(nodes: RendezvousConfig) -> list[str]:
    if (problem := backend_problem(nodes.rdzv_backend)) is not None:
        return [problem]
    conf = nodes.rdzv_conf_dict
    problems = settings_problems(conf, nodes.rdzv_backend, conf_keys(nodes.rdzv_backend))[1]
    if nodes.rdzv_id != "none":  # the id's rule is the dynamic rendezvous's (its keys)
        from phalanx.rendezvous.dynamic.keys import check_run_id

        if (problem := check_run_id(nodes.rdzv_id)) is not None:
            problems.append(problem)
    if conf.keys() & {"token", TOKEN_FILE_KEY}:  # no store here, but token= is refused
        token_from_conf(conf, {}, problems)  # everywhere (and a token file must be readable)
    return problems


def _one_node(config: LaunchConfig) -> Launch:
    # One node: no store, no peers; LocalRendezvous picks a fresh port per round.
    nodes = config.rendezvous
    own_id = nodes.standalone or nodes.rdzv_id == "none"
    run_id = random_run_id() if own_id else nodes.rdzv_id
    first_port = None
    if nodes.rdzv_backend == "static" and not nodes.standalone:
        first_port = nodes.master_port
    addr = "localhost" if first_port is None else nodes.master_addr
    return Launch(
        config,
        run_id,
        lambda: LocalRendezvous(run_id, addr, first_port=first_port, worker_port=nodes.worker_port),
    )
