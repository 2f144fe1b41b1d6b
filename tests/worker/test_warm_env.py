"""A large environment (over 1 MiB, as big as the kernel will exec) starts warm, and every
worker sees it byte for byte, warm and cold (docs/explanation/design.md, "Warm start")."""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import string
from pathlib import Path

import pytest

from phalanx.worker.protocol import ProtocolError, make_pair, receive, send
from support.launch import run_phalanx, worker

MODES = {"warm": [], "cold": ["--cold-start"]}
WARM_LINE = "warm start: workers fork from template pid"
# One string may be at most 128 KiB (MAX_ARG_STRLEN) to be exec'd at all -- the launcher's
# own exec included -- so the environment is 12 variables of 100 KiB: 1.2 MiB in all.
PIECES, PIECE = 12, 100 * 1024


def big_environment() -> dict[str, str]:
    rng = random.Random(24)  # varied bytes, so a lost or shifted piece shows in the digest
    alphabet = string.ascii_letters + string.digits + string.punctuation + " é€"
    return {f"PHALANX_TEST_BIG_{i}": "".join(rng.choices(alphabet, k=PIECE)) for i in range(PIECES)}


@pytest.mark.parametrize("mode", MODES)
def test_a_large_environment_reaches_every_worker_whole(tmp_path: Path, mode: str) -> None:
    big = big_environment()
    assert sum(len(v.encode()) for v in big.values()) > 1024 * 1024
    result = run_phalanx(
        [*MODES[mode], "--nproc-per-node", "2", "--log-dir", str(tmp_path),
         worker("env_digest.py")],
        env={**os.environ, **big},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warm start unavailable" not in result.stderr, result.stderr
    assert (WARM_LINE in result.stderr) == (mode == "warm"), result.stderr
    expected = {k: [len(v), hashlib.sha256(v.encode()).hexdigest()] for k, v in big.items()}
    seen = [json.loads(line.split("]: ", 1)[1]) for line in result.stdout.splitlines()]
    assert len(seen) == 2
    for data in seen:
        assert data["big"] == expected
    if mode == "warm":  # forked from the template, not exec'd by the launcher
        template = int(result.stderr.split(WARM_LINE, 1)[1].split()[0])
        assert {data["ppid"] for data in seen} == {template}


def test_a_message_too_big_for_a_packet_arrives_whole_with_its_fds() -> None:
    """Over real sockets: 3 MiB go in a memfd beside the message's own fd; a memfd whose
    size is not the one announced is a ``ProtocolError``, with every fd closed."""
    ours, theirs = make_pair()
    read_end, write_end = os.pipe()
    try:
        message = {"fork": {"env": {"X": "é" * (3 << 20)}}}
        send(ours, message, (write_end,))
        received = receive(theirs, max_fds=1)
        assert received is not None
        got, fds = received
        assert got == message and len(fds) == 1
        os.write(fds[0], b"ok")  # the pipe's write end, passed along
        os.close(fds[0])
        assert os.read(read_end, 2) == b"ok"
        body = os.memfd_create("short")
        os.write(body, b"{}")
        socket.send_fds(ours, [b'{"memfd": 10}'], [body])
        os.close(body)
        with pytest.raises(ProtocolError, match="another size"):
            receive(theirs)
    finally:
        for end in (ours, theirs):
            end.close()
        os.close(read_end)
        os.close(write_end)
