"""What of the controller's environment reaches the remote agents: explicit, printed once,
sent over ssh's stdin (never on a command line, where ``ps`` on either end would show it).

Forwarded: every variable whose name starts with one of ``DEFAULT_PREFIXES``, every name
given with ``--env NAME``, and every line of ``--env-file FILE`` (``NAME`` forwards the
controller's value, ``NAME=VALUE`` sets one). A name asked for but not set here is a usage
error rather than something silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

DEFAULT_PREFIXES = ("NCCL_", "PYTHON", "CUDA_", "PET_", "OMP_")
TOKEN_VAR = "PHALANX_RDZV_TOKEN"
# Values of these are shown as <secret> by --dry-run and never printed otherwise.
_SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(^|_)KEY($|_)", re.IGNORECASE)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def read_env_file(path: Path) -> list[tuple[str, str | None]]:
    """``NAME`` or ``NAME=VALUE`` per line, ``#`` comments; (name, None) forwards the
    controller's value. Raises ``ValueError`` naming the file and line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"--env-file {path}: cannot read it ({exc.strerror})") from None
    entries: list[tuple[str, str | None]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not _NAME.match(name.strip()):
            raise ValueError(f"{path}:{number}: expected NAME or NAME=VALUE, got a bad name")
        entries.append((name.strip(), value if sep else None))
    return entries


def forwarded_env(
    environ: Mapping[str, str],
    names: Sequence[str],
    file_entries: Sequence[tuple[str, str | None]],
) -> dict[str, str]:
    """The variables every remote agent gets (sorted by name). Raises ``ValueError`` for an
    ``--env`` name that is not set here."""
    chosen = {k: v for k, v in environ.items() if k.startswith(DEFAULT_PREFIXES)}
    missing = []
    for name in names:
        if not _NAME.match(name):
            raise ValueError(f"--env {name!r}: not a variable name")
        if name not in environ:
            missing.append(name)
        else:
            chosen[name] = environ[name]
    for name, value in file_entries:
        if value is not None:
            chosen[name] = value
        elif name in environ:
            chosen[name] = environ[name]
        else:
            missing.append(name)
    if missing:
        raise ValueError(
            f"--env/--env-file: not set in this environment, so nothing to forward: "
            f"{', '.join(missing)}"
        )
    chosen.pop(TOKEN_VAR, None)  # the job's own token is generated per job, never inherited
    return dict(sorted(chosen.items()))


def shown(env: Mapping[str, str]) -> list[str]:
    """``NAME=value`` lines for --dry-run, secrets' values hidden."""
    return [f"{k}={'<secret>' if is_secret(k) else v}" for k, v in env.items()]
