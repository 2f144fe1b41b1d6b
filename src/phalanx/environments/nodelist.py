"""Slurm nodelists (``node[01-04,07],gpu-a[1-2]``), expanded by the ``python-hostlist``
library: the syntax has padding, several ranges per bracket and several brackets per name,
which a hand-written parser gets wrong in some corner."""

from __future__ import annotations

import hostlist


def expand(nodelist: str, what: str = "nodelist") -> list[str]:
    """Every host of ``nodelist``, in order. ``ValueError`` (one line naming ``what``) for a
    malformed or empty list."""
    try:
        hosts: list[str] = hostlist.expand_hostlist(nodelist)
    except hostlist.BadHostlist as exc:
        raise ValueError(f"{what}={nodelist!r} is not a Slurm host list: {exc}") from None
    if not hosts:
        raise ValueError(f"{what}={nodelist!r} is not a Slurm host list: it names no host")
    if not all(host and not any(c.isspace() for c in host) for host in hosts):
        raise ValueError(f"{what}={nodelist!r} is not a Slurm host list: an empty or spaced name")
    return hosts


def first_host(nodelist: str, what: str = "nodelist") -> str:
    """The first host of a nodelist: ``'gpu[07-09,12],cpu1'`` -> ``'gpu07'``."""
    return expand(nodelist, what)[0]
