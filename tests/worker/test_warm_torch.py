"""A worker forked from the warm-start template cannot tell it from ``python -u script.py``
(split from ``test_warm_semantics.py`` so that two pytest workers run the halves): the
thread settings torch reads when it loads, and multiprocessing inside a worker (fork, spawn,
``torch.multiprocessing.spawn``, a DataLoader's workers), each run warm (the default) and
``--cold-start`` and held to the same expectations.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.launch import run_phalanx, worker
from support.warm_modes import MODES, by_rank, check_mode


@pytest.mark.parametrize(
    ("nproc", "env"),
    [("2", {}), ("1", {}), ("2", {"OMP_NUM_THREADS": "2"})],
    ids=["two-workers-default", "one-worker", "omp-2-given"],
)
def test_thread_settings_match_a_cold_start(
    tmp_path: Path, nproc: str, env: dict[str, str]
) -> None:
    seen = {}
    for mode, flags in MODES.items():
        result = run_phalanx(
            [
                *flags,
                "--nproc-per-node",
                nproc,
                "--log-dir",
                str(tmp_path),
                worker("warm_props.py"),
            ],
            env={**os.environ, **env},
        )
        assert result.returncode == 0, result.stderr
        check_mode(mode, result.stderr)
        seen[mode] = {
            rank: (d["threads"], d["parallel"], d["omp"], d["matmul"])
            for rank, d in by_rank(result.stdout).items()
        }
    assert len(seen["warm"]) == int(nproc)
    assert seen["warm"] == seen["cold"]


@pytest.mark.parametrize("mode", MODES)
def test_multiprocessing_inside_a_worker(tmp_path: Path, mode: str) -> None:
    result = run_phalanx([*MODES[mode], "--log-dir", str(tmp_path), worker("warm_mp.py")])
    assert result.returncode == 0, result.stderr
    check_mode(mode, result.stderr)
    assert result.stdout.splitlines() == [
        "[rank0]: fork [1, 4, 9]",
        "[rank0]: spawn [16, 25]",
        "[rank0]: mp.spawn [(0, '0', '__mp_main__'), (1, '0', '__mp_main__')]",
        "[rank0]: loader [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]",
    ]
