"""Where a run's status lives in its run directory, and the request files ``phalanx status``
leaves for its agent.

``<run dir>/status.json``                 this node's status, rewritten every ~2 s
``<run dir>/nodes/<rank>/status.json``    another node's, as it answered the last request
``<run dir>/nodes/<rank>/events.jsonl``   that node's events, as it answered (capped)
``<run dir>/requests/status-<nonce>``     a request: the CLI creates it, the agent notices
``<run dir>/requests/status-<nonce>.answer``  the agent's answer: which nodes answered
``<run dir>/requests/stop``               ``phalanx stop`` was here: the SIGTERM that follows
                                          is a stop, even where SIGTERM means a preemption
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from phalanx.events.run import NODES_DIR

STATUS_FILE = "status.json"
REQUESTS_DIR = "requests"
_REQUEST = re.compile(r"^status-([0-9a-f]{32})$")


def stop_marker(run_dir: Path) -> Path:
    return run_dir / REQUESTS_DIR / "stop"


def leave_stop_marker(run_dir: Path) -> None:
    (run_dir / REQUESTS_DIR).mkdir(mode=0o700, exist_ok=True)
    stop_marker(run_dir).touch(mode=0o600)


def node_dir(run_dir: Path, node_rank: int) -> Path:
    return run_dir / NODES_DIR / str(node_rank)


def new_request(run_dir: Path) -> str:
    """Leave a status request for the agent; return its nonce."""
    nonce = os.urandom(16).hex()  # as uuid4().hex: 32 random hex digits, without uuid's import
    requests = run_dir / REQUESTS_DIR
    requests.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(requests / f"status-{nonce}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    return nonce


def pending_requests(run_dir: Path) -> list[str]:
    """The nonces of the requests in ``run_dir`` (answered or not: the caller remembers)."""
    try:
        with os.scandir(run_dir / REQUESTS_DIR) as entries:
            return sorted(m.group(1) for e in entries if (m := _REQUEST.match(e.name)))
    except OSError:
        return []


def request_path(run_dir: Path, nonce: str) -> Path:
    return run_dir / REQUESTS_DIR / f"status-{nonce}"


def answer_path(run_dir: Path, nonce: str) -> Path:
    return run_dir / REQUESTS_DIR / f"status-{nonce}.answer"


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when it is missing, torn or not an object."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
