"""The rendezvous part of a launch is checked once: what the check parsed (the endpoint, the
token, the settings) is what the backend opens the store with, so nothing is read twice.

A real c10d store is hosted on loopback from a launch whose token file was removed after the
check; a client with the same token proves it, one with another is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.cli.argv import parse_launch
from phalanx.errors import RendezvousError
from phalanx.rendezvous.stores.agentstore.auth import Token
from phalanx.rendezvous.stores.agentstore.client import AgentKVStore
from phalanx.rendezvous.stores.base import StoreUnavailable
from phalanx.resources.ports import free_port
from support.launch import worker

SECRET = b"a-token-the-check-read-once"


def _launch_argv(port: int, token_file: Path) -> list[str]:
    return [
        "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-id", "checked-once",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-conf", f"token_file={token_file},is_host=true,join_timeout=5",
        worker("allreduce.py"),
    ]  # fmt: skip


def test_the_store_opens_with_the_token_the_check_read(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_bytes(SECRET + b"\n")
    token_file.chmod(0o600)
    port = free_port()
    launch = parse_launch(_launch_argv(port, token_file), {})
    token_file.unlink()  # read again, it would be "cannot read it": the launch holds what was read
    handler = launch.open_rendezvous()
    try:
        assert handler.run_id == "checked-once"
        rightful = AgentKVStore.connect(
            "127.0.0.1", port, token=Token(SECRET, "test"), connect_timeout=5, read_timeout=5
        )
        rightful.close()
        with pytest.raises((StoreUnavailable, RendezvousError)):
            AgentKVStore.connect(
                "127.0.0.1", port, token=Token(b"another", "test"), connect_timeout=2,
                read_timeout=2,
            )  # fmt: skip
    finally:
        handler.shutdown()


def test_a_token_file_that_cannot_be_read_is_one_problem_of_the_launch(tmp_path: Path) -> None:
    from phalanx.errors import UsageError

    with pytest.raises(UsageError) as info:
        parse_launch(_launch_argv(free_port(), tmp_path / "missing"), {})
    said = [p for p in info.value.problems if "token_file" in p]
    assert len(said) == 1 and "cannot read it" in said[0], info.value.problems
