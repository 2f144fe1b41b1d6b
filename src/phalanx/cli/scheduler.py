"""The flags a scheduler stands for, filled in before the command line is converted.

Precedence, for every flag: given on the command line, then ``PET_<FLAG>`` (torchrun's
variables, read by the parser), then what the scheduler says (``phalanx.environments``), then
the built-in default. What was derived is one line per fact, naming its variable, printed
at start and by ``--dry-run``. ``--hosts``/``--hostfile`` (the host list says it all) and
``--standalone`` (one node by definition) read no scheduler.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from phalanx import parsing
from phalanx.cli.parser import build_parser
from phalanx.environments import Detected, Fact, detect_as

# The flags a scheduler may stand for; the last three mean something only to static.
FACT_DESTS = (
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
    "node_rank", "master_addr", "master_port",
)  # fmt: skip
STATIC_ONLY = frozenset({"node_rank", "master_addr", "master_port"})


@dataclass(frozen=True)
class Derivation:
    lines: tuple[str, ...] = ()  # one per fact used, for the start of the job
    problems: tuple[str, ...] = ()
    # dest -> where the user gave it: "the command line" or "PET_NNODES=2"
    given: Mapping[str, str] = field(default_factory=dict)


NO_DERIVATION = Derivation()


def given_flags(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The flags the user set (argparse destinations), and where."""
    given = {
        dest: "the command line"
        for dest in vars(build_parser({}, given_only=True).parse_args(list(argv)))
    }
    for dest in FACT_DESTS:
        var = f"PET_{dest.upper()}"
        if dest not in given and var in environ:
            given[dest] = f"{var}={environ[var]}"
    return given


def derive(
    ns: argparse.Namespace, argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[argparse.Namespace, Derivation]:
    """``ns`` with the scheduler's facts for the flags the user did not set, and the lines
    and problems that go with them (a new namespace: ``ns`` is not changed)."""
    given = given_flags(argv, environ)
    if ns.hosts is not None or ns.hostfile is not None or ns.standalone:
        return ns, Derivation(given=given)
    try:
        detected = detect_as(str(ns.scheduler).strip(), environ)
    except ValueError as exc:
        return ns, Derivation(problems=(str(exc),), given=given)
    if detected is None:
        return ns, Derivation(given=given)
    facts = _used_facts(detected, ns, given)
    problems = tuple(p.text for p in detected.problems if not any(d in given for d in p.unless))
    lines = tuple(f"{detected.scheduler}: {f.flag} {f.value} (from {f.source})" for f in facts)
    derived = argparse.Namespace(**{**vars(ns), **{f.dest: f.value for f in facts}})
    return derived, Derivation(lines, problems, given)


def _used_facts(detected: Detected, ns: argparse.Namespace, given: Mapping[str, str]) -> list[Fact]:
    facts = [f for f in detected.facts if f.dest not in given]
    if "nnodes" in given and str(ns.nnodes).strip() == "1":  # one node: no store to meet at
        return [f for f in facts if f.dest not in STATIC_ONLY | {"rdzv_backend"}]
    backend = ns.rdzv_backend if "rdzv_backend" in given else detected.value("rdzv_backend")
    if backend != "static":  # an elastic policy's PET_RDZV_BACKEND, or the user's choice
        return [f for f in facts if f.dest not in STATIC_ONLY]
    if "rdzv_endpoint" in given and "master_addr" not in given:
        # torchrun's static reads --rdzv-endpoint when given: that is where node 0 hosts.
        try:
            endpoint = parsing.parse_endpoint(ns.rdzv_endpoint)
        except ValueError:
            return facts  # the converter reports it
        source = f"--rdzv-endpoint {ns.rdzv_endpoint}"
        moved = [Fact("master_addr", endpoint.host, source)]
        if endpoint.port is not None and "master_port" not in given:
            moved.append(Fact("master_port", str(endpoint.port), source))
        replaced = {f.dest for f in moved}
        facts = [f for f in facts if f.dest not in replaced] + moved
    return facts
