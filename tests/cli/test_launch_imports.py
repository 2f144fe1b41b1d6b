"""What a one-node launch imports: only what runs it. The agent's own start is on every
launch's critical path (with the warm service, most of what is left of it: python and ~150
phalanx modules before the first fork), so what only another kind of job uses -- many hosts
over ssh, the store and the dynamic rendezvous, the node check, the comparison of the nodes'
code, the package metadata -- is imported only when that job runs. One real launch under
``python -X importtime`` (the agent's own imports, to its exit); the modules are named, not
timed (``benchmarks/launch_timeline.py`` times them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Prefixes of modules a one-node launch must not import (each was imported before issue 43).
NOT_ON_ONE_NODE = (
    "phalanx.hosts.run", "phalanx.hosts.controller", "phalanx.hosts.ssh", "phalanx.hosts.plan",
    "phalanx.hosts.preflight", "phalanx.rendezvous.backends.", "phalanx.rendezvous.dynamic.handler",
    "phalanx.rendezvous.dynamic.formation", "phalanx.rendezvous.stores.agentstore.server",
    "phalanx.rendezvous.stores.agentstore.client", "phalanx.rendezvous.addr",
    "phalanx.nodecheck.round", "phalanx.nodecheck.probes", "phalanx.nodecheck.verdict",
    "phalanx.consistency.", "importlib.metadata", "email.", "csv", "concurrent.futures", "psutil",
    # ... and since its fourth part: the host list's parsing, Slurm's nodelists, the run id's
    # and the run directory's randomness by their stdlib modules (uuid imports platform,
    # secrets imports hmac and base64), the progress hook's base classes (importlib.abc
    # imports importlib.resources), "did you mean" for a mistake
    "phalanx.hosts", "phalanx.environments.nodelist", "hostlist", "uuid", "platform",
    "secrets", "hmac", "importlib.abc", "importlib.resources", "difflib",
    # ... and since its fifth part, what only a failure, a hang, a stack request, a preemption,
    # a rendezvous over a store or a template of the run's own reads: the hang analysis, the
    # ranks' stacks and their files, the failure's classifier, the preemption's report, the
    # dynamic rendezvous's keys (the run id's rule), the rendezvous spec, the source scan
    "phalanx.hang.analysis", "phalanx.hang.stacks", "phalanx.hang.files", "phalanx.hang.jobstacks",
    "phalanx.report.classify", "phalanx.agent.preempted", "phalanx.rendezvous.dynamic",
    "phalanx.rendezvous.spec", "phalanx.supervisor.reach",
)  # fmt: skip
# ... and what it must import (the probe is seeing the agent run, not an early exit).
RUNS_THE_AGENT = ("phalanx.agent.agent", "phalanx.supervisor.group", "phalanx.rendezvous.local")


def test_a_one_node_launch_imports_only_what_runs_it(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'])\n")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "phalanx", "--standalone",
         "--nproc-per-node", "1", "--cold-start", "--log-dir", str(tmp_path / "logs"),
         str(script)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0" in done.stdout
    imported = {
        line.split("|")[2].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert set(RUNS_THE_AGENT) <= imported
    wrong = sorted(m for m in imported if m.startswith(NOT_ON_ONE_NODE) or m in NOT_ON_ONE_NODE)
    assert wrong == []


def test_one_node_still_refuses_what_it_checks_without_the_backend(tmp_path: Path) -> None:
    """Its --rdzv-conf keys and token checked from the light modules, as before."""
    script = tmp_path / "job.py"
    script.write_text("")
    for conf, said in (
        ("token=x", "--rdzv-conf token: the rendezvous token is never given on the command line"),
        ("token_file=/nonexistent", "--rdzv-conf token_file=/nonexistent: cannot read it"),
        ("bogus=1", "--rdzv-conf bogus: unknown key for c10d (known: close_timeout,"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "phalanx", "--standalone", "--rdzv-conf", conf, str(script)],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
