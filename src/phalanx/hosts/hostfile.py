"""Host lists: DeepSpeed's hostfile (``host slots=N``, ``#`` comments) and Horovod's
``host:N,host:N``, read unchanged. A host without a count gets ``default_slots``
(``--nproc-per-node``)."""

from __future__ import annotations

import re
from pathlib import Path

from phalanx.config import HostSlots

# [user@]name: what ssh takes as a destination. A leading '-' would read as an ssh option.
_HOST = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9_][A-Za-z0-9._-]*$")
_SLOTS = re.compile(r"^slots=(\d+)$")


def _host(text: str, where: str) -> str:
    if not _HOST.match(text):
        raise ValueError(f"{where}: {text!r} is not a host name (expected [user@]host)")
    return text


def _count(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{where}: expected a worker count of 1 or more, got {text!r}")
    return int(text)


def _unique(hosts: list[HostSlots], where: str) -> tuple[HostSlots, ...]:
    seen: set[str] = set()
    for entry in hosts:
        if entry.host in seen:
            raise ValueError(f"{where}: host {entry.host!r} is listed twice")
        seen.add(entry.host)
    if not hosts:
        raise ValueError(f"{where}: no hosts listed")
    return tuple(hosts)


def parse_hosts(text: str, default_slots: int) -> tuple[HostSlots, ...]:
    """``"h1:8,h2:8"`` (Horovod's -H) -> the hosts in order."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, count = item.rpartition(":") if ":" in item else (item, "", "")
        where = f"--hosts {item!r}"
        slots = _count(count, where) if sep else default_slots
        hosts.append(HostSlots(_host(name, where), slots))
    return _unique(hosts, "--hosts")


def parse_hostfile_text(text: str, source: str, default_slots: int) -> tuple[HostSlots, ...]:
    """A DeepSpeed hostfile's text; ``source`` names it in errors (``FILE:LINE: ...``)."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}:{number}"
        if len(words) > 2:
            raise ValueError(f"{where}: expected 'host slots=N', got {raw.strip()!r}")
        slots = default_slots
        if len(words) == 2:
            match = _SLOTS.match(words[1])
            if match is None:
                raise ValueError(f"{where}: expected 'slots=N' after the host, got {words[1]!r}")
            slots = _count(match.group(1), where)
        hosts.append(HostSlots(_host(words[0], where), slots))
    return _unique(hosts, source)


def read_hostfile(path: Path, default_slots: int) -> tuple[HostSlots, ...]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"--hostfile {path}: cannot read it ({exc.strerror})") from None
    return parse_hostfile_text(text, str(path), default_slots)
