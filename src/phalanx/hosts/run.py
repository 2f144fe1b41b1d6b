"""``phalanx --hosts/--hostfile``: plan, print what is forwarded, pre-flight, run."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from phalanx.config import LaunchConfig
from phalanx.errors import UsageError
from phalanx.hosts.controller import Controller
from phalanx.hosts.plan import build_hosts_plan, plan_for_dry_run
from phalanx.hosts.preflight import preflight
from phalanx.hosts.remote_env import TOKEN_VAR


def run_hosts(config: LaunchConfig, argv: Sequence[str]) -> int:
    """``argv``: the controller's command line (the agents get it without the
    controller-only flags, plus their own rendezvous flags)."""
    try:
        plan = plan_for_dry_run(config, argv) if config.dry_run else build_hosts_plan(config, argv)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if config.dry_run:
        print(plan.describe())
        return 0
    names = [name for name in plan.env if name != TOKEN_VAR]
    print(f"phalanx: {len(plan.hosts)} hosts, {plan.workers} workers; environment forwarded "
          f"to every host: {', '.join(names) or '(none)'} (and the job's {TOKEN_VAR})",
          file=sys.stderr, flush=True)  # fmt: skip
    for skipped in plan.skipped:
        print(skipped.line(), file=sys.stderr, flush=True)
    if plan.spares:
        print(f"phalanx: the last {plan.spares} host(s) started wait as spares (beyond --nnodes "
              "MAX): each takes a lost or excluded member's place", file=sys.stderr, flush=True)  # fmt: skip
    problems = preflight(config, plan)
    if problems:
        raise UsageError([*problems, "pre-flight failed: nothing was started on any host"])
    return Controller(plan, config.recovery.preempt_signals).run()
