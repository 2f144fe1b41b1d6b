"""Secrets phalanx is given, and the one rule about them: they stay in the agent.

A secret reaches phalanx from a file or from the environment (``--rdzv-conf password=`` still
works, as in torchrun, with a warning: ``ps`` and shell history show it; the agent store's
token has no command-line spelling at all). Workers need none of
them, so ``worker_environment`` removes each from what the template and the workers inherit:
the variables below, and the secret keys of ``PET_RDZV_CONF`` (torchrun's environment
spelling of ``--rdzv-conf``, which workers would otherwise inherit verbatim).
"""

from __future__ import annotations

from collections.abc import Mapping

ETCD_PASSWORD_ENV = "PHALANX_ETCD_PASSWORD"
RDZV_TOKEN_ENV = "PHALANX_RDZV_TOKEN"  # the agent store's token (c10d, static)
SECRET_ENV = (ETCD_PASSWORD_ENV, RDZV_TOKEN_ENV)
# --rdzv-conf keys whose value is a secret ("token" is refused before any worker starts;
# it is stripped all the same, in case a PET_RDZV_CONF carries it past the check).
SECRET_CONF_KEYS = frozenset({"password", "token"})
_CONF_ENV = "PET_RDZV_CONF"


def without_secret_keys(conf_text: str) -> str:
    """``k=v,...`` with the secret keys' items left out (the others kept as written)."""
    kept = [
        item
        for item in conf_text.split(",")
        if item.partition("=")[0].strip() not in SECRET_CONF_KEYS
    ]
    return ",".join(kept)


def worker_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the secrets phalanx reads (see the module docstring)."""
    result = {k: v for k, v in env.items() if k not in SECRET_ENV}
    if _CONF_ENV in result:
        result[_CONF_ENV] = without_secret_keys(result[_CONF_ENV])
    return result
