"""Pre-flight: before anything starts, every host at once is asked for its facts
(``hosts.probe`` over ssh, with the environment the agent will have) and compared with the
controller's: ssh reachable, the same Python, phalanx and torch versions, the script present
with the same content (sha256), the rendezvous port free on the host that will serve it.
Each problem is one line naming the host."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from phalanx.config import LaunchConfig, LaunchMode
from phalanx.hosts.plan import HostPlan, HostsPlan
from phalanx.hosts.probe import facts
from phalanx.hosts.ssh import env_line, remote_command, ssh_argv

PROBE_MODULE = "phalanx.hosts.probe"
TIMEOUT = 30.0  # per host; ssh's own ConnectTimeout is 10 s


def _script(config: LaunchConfig) -> str | None:
    return (
        config.workers.program
        if config.workers.mode in (LaunchMode.SCRIPT, LaunchMode.RUN_PATH)
        else None
    )


def _ask(plan: HostsPlan, host: HostPlan, args: Sequence[str], config: LaunchConfig) -> dict[str, Any] | str:  # fmt: skip
    """The host's facts, or the problem reaching it."""
    command = remote_command(plan.cwd, plan.python, PROBE_MODULE, args)
    argv = ssh_argv(host.entry.host, command, config.remote.ssh_config)
    try:
        done = subprocess.run(argv, input=env_line(plan.env), capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"no answer over ssh within {TIMEOUT:g} s"
    err = done.stderr.decode(errors="replace").strip().splitlines()
    last = err[-1] if err else f"exit status {done.returncode}"
    if done.returncode == 255:
        return f"ssh failed: {last}"
    if done.returncode != 0:
        return f"cannot run {plan.python} in {plan.cwd} there: {last}"
    try:
        found: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"the probe gave no answer: {last}"
    return found


def _compare(name: str, mine: dict[str, Any], theirs: dict[str, Any], script: str | None) -> list[str]:  # fmt: skip
    problems = []
    for key, what in (("python", "Python"), ("phalanx", "phalanx"), ("torch", "torch")):
        if theirs.get(key) != mine[key]:
            problems.append(
                f"{name}: {what} {theirs.get(key) or 'not installed'}, but the controller has "
                f"{mine[key] or 'none'}"
            )
    if script is not None and theirs.get("script_sha256") is None:
        problems.append(f"{name}: the script {script} is not there (in {mine['cwd']})")
    elif script is not None and theirs["script_sha256"] != mine["script_sha256"]:
        problems.append(f"{name}: the script {script} differs from the controller's (sha256)")
    if theirs.get("port_free") is False:
        problems.append(f"{name}: the rendezvous port {theirs.get('port')} is already in use")
    return problems


def preflight(config: LaunchConfig, plan: HostsPlan) -> list[str]:
    """Every problem found, one line each, in host order (empty: go)."""
    script = _script(config)
    mine = facts(script, None, None)

    def check(index: int, host: HostPlan) -> list[str]:
        # The port is checked where the first host will serve it (not for an endpoint of the
        # user's own, which may be anywhere).
        serves = index == 0 and not config.rendezvous.rdzv_endpoint
        port = [plan.rdzv_addr, str(plan.rdzv_port)] if serves else ["-", "-"]
        found = _ask(plan, host, [script or "-", *port], config)
        if isinstance(found, str):
            return [f"{host.name}: {found}"]
        found["port"] = plan.rdzv_port
        return _compare(host.name, mine, found, script)

    workers = min(64, len(plan.hosts))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="preflight") as pool:
        results = pool.map(check, range(len(plan.hosts)), plan.hosts)
        return [problem for problems in results for problem in problems]
