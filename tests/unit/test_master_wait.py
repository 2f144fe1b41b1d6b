"""``phalanx.worker.master``: which ranks wait for rank 0's store, for how long
(``PHALANX_MASTER_WAIT``), and that a bad value stops the launch as a usage error. The wait
itself against a real listener on loopback; the two-node form is
``tests/rendezvous/test_master_first.py``."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.worker.master import MASTER_WAIT, WAIT_ENV, await_master, master_wait
from support.launch import PHALANX, worker


@pytest.mark.parametrize(
    ("text", "expected"),
    [(None, MASTER_WAIT), ("", MASTER_WAIT), (" ", MASTER_WAIT), ("0", 0.0), ("2.5", 2.5),
     (" 30 ", 30.0)],
)  # fmt: skip
def test_the_wait_is_the_variables_seconds_or_the_default(
    text: str | None, expected: float
) -> None:
    assert master_wait({} if text is None else {WAIT_ENV: text}) == expected


@pytest.mark.parametrize("text", ["abc", "-1", "nan", "inf", "1s"])
def test_a_wait_that_is_not_seconds_is_none(text: str) -> None:
    assert master_wait({WAIT_ENV: text}) is None


@contextlib.contextmanager
def _listener() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def _env(port: int, **more: str) -> dict[str, str]:
    return {"GROUP_WORLD_SIZE": "2", "GROUP_RANK": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "False", **more}  # fmt: skip


def test_a_rank_of_another_node_waits_for_the_store_and_no_other_rank_does() -> None:
    with _listener() as port:
        assert await_master(_env(port))
        assert not await_master(_env(port, GROUP_RANK="0"))  # rank 0's own node
        assert not await_master(_env(port, GROUP_WORLD_SIZE="1"))
        assert not await_master(_env(port, TORCHELASTIC_USE_AGENT_STORE="True"))
        assert not await_master(_env(port, **{WAIT_ENV: "junk"}))  # (the agent refused it)
    # Nobody listens now: the wait ends at its bound, 0 at once.
    assert not await_master(_env(port, **{WAIT_ENV: "0.05"}))
    assert not await_master(_env(port, **{WAIT_ENV: "0"}))


def test_a_bad_wait_stops_the_launch_with_exit_2_and_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, **{WAIT_ENV: "soon"})
    done = subprocess.run(
        [*PHALANX, "--log-dir", str(tmp_path), worker("echo_args.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"{WAIT_ENV}='soon': expected a number of seconds >= 0" in done.stderr
    assert "Traceback" not in done.stderr
