"""What a scheduler says about this node, as plain data: the flags it stands for."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Fact:
    """One flag's value, derived from the scheduler's variables.

    ``dest`` is the flag's argparse destination (``nnodes`` for ``--nnodes``); ``source``
    names the variable(s) it came from, for the line printed at start.
    """

    dest: str
    value: str
    source: str

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


@dataclass(frozen=True)
class Problem:
    """Why the scheduler's facts cannot start this node; moot when the user gave any of
    ``unless`` (argparse destinations) explicitly."""

    text: str
    unless: tuple[str, ...] = ()


@dataclass(frozen=True)
class Detected:
    """The scheduler that started this process and what it says (``detect``'s answer)."""

    scheduler: str
    facts: tuple[Fact, ...] = ()
    problems: tuple[Problem, ...] = ()

    def value(self, dest: str) -> str | None:
        return next((fact.value for fact in self.facts if fact.dest == dest), None)


def slurm_port(job_id: str) -> int | None:
    """The port every process of Slurm job ``job_id`` derives alike: ``15000 + id % 10000``
    (jobs sharing a node rarely collide). Both faces use it: the CLI for its static store,
    ``phalanx.init()`` for the workers' ``MASTER_PORT``. None when ``job_id`` is no number."""
    return 15000 + int(job_id) % 10000 if job_id.isascii() and job_id.isdigit() else None


Derive = Callable[[Mapping[str, str]], "str | None"]


def no_default(env: Mapping[str, str]) -> str | None:
    return None


@dataclass(frozen=True)
class LauncherVars:
    """What a launcher tells each worker it starts, by the variable names it exports (the
    rank facts; ``Detected`` holds the node facts). A table, because launchers only rename."""

    name: str
    marker: str  # set only in processes this launcher started
    rank: str
    local_rank: str
    world_size: str
    default_addr: Derive  # None when no default can be derived
    default_port: Derive
    hint: str  # how to pass MASTER_ADDR/MASTER_PORT under this launcher
