"""``python -m phalanx.hosts.probe SCRIPT|- ADDR PORT``: this host's facts for the pre-flight,
as one JSON line. Imports nothing heavy: torch's version is read from its metadata (the
``Version:`` of the first ``torch-*.dist-info`` on ``sys.path``, the one ``import torch``
would find; ``importlib.metadata`` only where that finds none, since importing it costs more
than the rest of the probe, and a 64-host pre-flight pays that 64 times)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
from typing import Any

from phalanx.version import __version__


def _version(dist: str) -> str | None:
    wanted = re.compile(rf"^{re.escape(dist)}-[^-]+\.dist-info$", re.IGNORECASE)
    for entry in sys.path:
        try:
            names = sorted(n for n in os.listdir(entry or ".") if wanted.match(n))
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(entry or ".", name, "METADATA"), encoding="utf-8") as f:
                    for line in f:
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
                        if not line.strip():
                            break  # the headers end at the first blank line
            except OSError:
                continue
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def script_hash(path: str) -> str | None:
    """sha256 of the file's content; None when there is no such file."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def port_free(addr: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as sock:
        # TIME_WAIT leftovers of an earlier job do not stop the store from listening either.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((addr, port))
        except OSError:
            return False
    return True


def facts(script: str | None, addr: str | None, port: int | None) -> dict[str, Any]:
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "phalanx": __version__,
        "torch": _version("torch"),
        "cwd": os.getcwd(),
        "script_sha256": script_hash(script) if script is not None else None,
        "port_free": port_free(addr, port) if addr is not None and port is not None else None,
    }


def main(argv: list[str]) -> int:
    script, addr, port = argv
    found = facts(
        None if script == "-" else script,
        None if addr == "-" else addr,
        None if port == "-" else int(port),
    )
    print(json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
