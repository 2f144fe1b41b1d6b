"""torchrun's abbreviated long flags (``--redirect=3`` for ``--redirects``), without letting
them touch the script's own arguments.

argparse's ``allow_abbrev`` classifies every word of the command line, the script's too, so a
script argument such as ``--r`` would be refused as ambiguous. Instead the launcher's part of
the command line (everything before the training script) is walked here, each unambiguous
prefix spelled out in full, and the parser runs with ``allow_abbrev=False``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from phalanx.cli.usage import did_you_mean
from phalanx.errors import UsageError

# torchrun 2.13's long flags (dashed spelling). A prefix that is torchrun's abbreviation of
# one of them keeps that meaning even where phalanx's own flags share the prefix since
# (``--node 1`` is torchrun's ``--node-rank 1``, not ambiguous with ``--node-check``).
TORCHRUN_FLAGS = frozenset({
    "--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id",
    "--rdzv-conf", "--standalone", "--max-restarts", "--monitor-interval", "--start-method",
    "--event-log-handler", "--role", "--module", "--no-python", "--run-path", "--log-dir",
    "--redirects", "--tee", "--local-ranks-filter", "--node-rank", "--master-addr",
    "--master-port", "--local-addr", "--logs-specs", "--numa-binding", "--signals-to-handle",
    "--duplicate-stdout-filters", "--duplicate-stderr-filters", "--virtual-local-rank",
})  # fmt: skip


def expand(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``argv`` with the launcher's abbreviated long flags spelled out; words from the
    training script on are returned as given. An ambiguous prefix or an unknown flag is a
    ``UsageError`` naming the candidates."""
    actions = parser._option_string_actions
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--" or not word.startswith("-") or word == "-":
            return [*out, *argv[i:]]  # the script (or --, then the script) starts here
        name, eq, value = word.partition("=")
        attached = bool(eq)
        if word.startswith("--"):
            name = _full_name(name, actions)
            word = f"{name}{eq}{value}"
        elif word not in actions and word[:2] in actions:
            name, attached = word[:2], True  # -r3: the short flag with its value attached
        action = actions.get(name)
        out.append(word)
        i += 1
        if action is not None and action.nargs != 0 and not attached and i < len(argv):
            out.append(argv[i])  # its value, whatever it looks like
            i += 1
    return out


def _full_name(name: str, actions: dict[str, argparse.Action]) -> str:
    if name in actions:
        return name
    matches = sorted({a.option_strings[0] for flag, a in actions.items()
                      if flag.startswith(name) and flag.startswith("--")})  # fmt: skip
    # torchrun's flags are a subset of these: one of them alone is what torchrun reads.
    torchruns = [m for m in matches if m in TORCHRUN_FLAGS]
    if len(matches) == 1 or len(torchruns) == 1:
        return matches[0] if len(matches) == 1 else torchruns[0]
    if matches:
        raise UsageError(f"ambiguous option: {name} could match {', '.join(matches)}")
    longs = [flag for flag in actions if flag.startswith("--")]
    raise UsageError(f"unrecognized arguments: {name}{did_you_mean(name, longs)}")
