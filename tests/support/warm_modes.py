"""What the warm-versus-cold tests share (``tests/worker/test_warm_semantics.py`` and
``test_warm_torch.py``): the two modes' flags, the line that says a job started warm, and
the ``[rankN]: {json}`` lines the probe workers print."""

from __future__ import annotations

import json

MODES: dict[str, list[str]] = {"warm": [], "cold": ["--cold-start"]}
WARM_LINE = "warm start: workers fork from template pid"


def by_rank(stdout: str) -> dict[int, dict[str, object]]:
    """``[rankN]: {json}`` lines -> {N: data}."""
    out = {}
    for line in stdout.splitlines():
        prefix, _, text = line.partition("]: ")
        if text.startswith("{"):
            out[int(prefix.removeprefix("[rank"))] = json.loads(text)
    return out


def check_mode(mode: str, stderr: str) -> None:
    """The job started warm exactly when ``mode`` is warm."""
    assert (WARM_LINE in stderr) == (mode == "warm"), stderr
