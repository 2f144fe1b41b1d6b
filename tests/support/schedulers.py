"""Environments as schedulers set them, for tests of phalanx.environments and the CLI."""

from __future__ import annotations

import os
import socket

# Variables of a scheduler or launcher that must not leak from the test's own environment.
_PREFIXES = ("SLURM_", "SLURMD_", "OMPI_", "PMI_", "PMIX_", "MPI_", "PET_", "KUBERNETES_")
_NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
          "JOB_COMPLETION_INDEX", "TORCHELASTIC_RUN_ID")  # fmt: skip


def scheduler_env(**variables: str) -> dict[str, str]:
    """This process's environment without any scheduler's variables, plus ``variables``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES) and k not in _NAMES}
    env.update(variables)
    return env


def slurm_job_id_with_free_port() -> str:
    """A job id whose derived port (15000 + id % 10000) is free now."""
    for port in range(15000 + os.getpid() % 9000, 25000):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return str(port - 15000 + 10000 * 4)  # a big id, as real ones are
    raise AssertionError("no free port in 15000-25000")
