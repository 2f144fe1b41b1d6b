"""A stand-in node agent for the real rendezvous tests: runs a list of steps, prints JSON lines.

usage: rdzv_agent.py SPEC_JSON STEP...   steps: round | fail | await:KIND | claim:MAX |
       done:ok|fail | round_error | sleep:SECONDS
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

from phalanx.errors import RendezvousError
from phalanx.rendezvous.api import EventKind
from phalanx.rendezvous.registry import create_handler
from phalanx.rendezvous.spec import RendezvousSpec


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


handler = create_handler(RendezvousSpec(**json.loads(sys.argv[1])))
joined = None  # the round joined last
try:
    for step in sys.argv[2:]:
        name, _, arg = step.partition(":")
        if name == "round":
            joined = handler.next_round(2)
            say(step="round", **asdict(joined.result))
        elif name == "round_error":
            try:
                handler.next_round(2)
                say(step="round_error", error=None)
            except RendezvousError as exc:
                say(step="round_error", error=str(exc))
        elif name == "fail":
            joined.report_failure({"rank": 1, "exit_code": 7})
        elif name == "await":
            deadline = time.monotonic() + 60
            while (event := handler.poll()) is None or event.kind is not EventKind(arg):
                assert time.monotonic() < deadline, f"no {arg} event"
                time.sleep(0.05)
            say(step="event", kind=event.kind.value, node_rank=event.node_rank, detail=event.detail)
        elif name == "claim":
            say(step="claim", restart=joined.claim_restart(int(arg)))
        elif name == "done":
            handler.report_done(arg == "ok")
        elif name == "sleep":
            time.sleep(float(arg))
finally:
    handler.shutdown()
say(step="exit")
