# usage: agent_on_go.py GO PHALANX_ARGS... -- a phalanx agent whose interpreter start and
# imports are paid before it starts: it imports what an agent imports, marks GO.ready, waits
# (at most 120 s) for the file GO, then runs `python -m phalanx PHALANX_ARGS...` in this
# process. For a test that needs an agent started again to reach its rendezvous at a set
# moment, not 0.3-0.5 s after its exec (more under load), as a cold interpreter would.
import importlib
import os
import runpy
import sys
import time

AGENT = ("phalanx.cli.main", "phalanx.launch", "phalanx.agent.agent",
         "phalanx.rendezvous.backends.successor", "phalanx.rendezvous.dynamic.handler")  # fmt: skip
for module in AGENT:  # (most of what an agent imports: the rest comes with these)
    importlib.import_module(module)
go = sys.argv[1]
open(go + ".ready", "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("agent_on_go.py: never let go")
    time.sleep(0.001)
sys.argv = ["phalanx", *sys.argv[2:]]
runpy.run_module("phalanx", run_name="__main__", alter_sys=True)
