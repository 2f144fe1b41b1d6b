# usage: guardian_agent.py WORD_JSON [close] -- a stand-in agent: starts a guardian, gives it
# the last word, prints the guardian's pid, then sleeps until killed; with "close" it leaves
# normally instead (Guardian.close: the "=" line) once stdin reaches EOF.
import json
import sys
import time

from phalanx.supervisor.guardian import Guardian

guardian = Guardian()
guardian.say(json.loads(sys.argv[1]))
print(guardian.pid, flush=True)
if sys.argv[2:] == ["close"]:
    sys.stdin.read()
    guardian.close()
else:
    time.sleep(300)
