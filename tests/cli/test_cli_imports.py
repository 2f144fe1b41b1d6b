"""What a CLI call imports: a subcommand (``phalanx status``, ``ls``, ``logs``, ``stop``,
``stacks``, ``timeline``, ``clean``, ``check``) and a launch that ends before a node runs
(a usage error) never import the agent. Scripts and this suite make hundreds of such calls,
and the agent's modules cost about 0.2 s of CPU each time (``python -X importtime -m phalanx
status RUN_DIR``). One interpreter of its own per call; the modules are counted, not timed."""

from __future__ import annotations

import json
import subprocess
import sys

from phalanx.cli.usage import SUBCOMMAND_NAMES

# Each subcommand's module imported as ``phalanx NAME`` imports it (cli.main first), then a
# usage error through the launch path: the agent modules loaded after each, as JSON.
PROBE = """\
import contextlib, importlib, io, json, sys
from phalanx.cli.main import main
agent = lambda: sorted(m for m in sys.modules if m == "phalanx.agent" or m.startswith("phalanx.agent."))
if sys.argv[1] == "launch":
    with contextlib.redirect_stderr(io.StringIO()):
        code = main(["--nproc-per-node", "x", "train.py"])
    print(json.dumps([code, agent()]))
else:
    importlib.import_module("phalanx.cli." + sys.argv[1])
    print(json.dumps([0, agent()]))
"""


def _agent_modules(what: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, what], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    code, modules = json.loads(done.stdout)
    return code, modules


def test_no_subcommand_imports_the_agent() -> None:
    loaded = {name: _agent_modules(name)[1] for name in SUBCOMMAND_NAMES if name != "help"}
    assert loaded == {name: [] for name in loaded}, loaded


def test_a_usage_error_is_said_without_importing_the_agent() -> None:
    assert _agent_modules("launch") == (2, [])
