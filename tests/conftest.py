"""Shared fixtures."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import pytest

from hosts import Loopback, NamespaceHosts, Node
from memcluster import Cluster
from netns import NetNamespaces, unavailable_reason


@contextlib.contextmanager
def _namespace_pool() -> Iterator[Callable[[int], NetNamespaces]]:
    """Makes connected namespaces on request; removes every one at exit, even on failure,
    and checks that none is left (tests end their processes inside them first)."""
    made: list[NetNamespaces] = []

    def make(count: int) -> NetNamespaces:
        spaces = NetNamespaces(count)
        made.append(spaces)
        spaces.create()
        return spaces

    try:
        yield make
    finally:
        for spaces in made:
            spaces.destroy()
            assert spaces.leftovers() == [], f"namespaces left behind: {spaces.leftovers()}"


@pytest.fixture
def netns() -> Iterator[Callable[[int], NetNamespaces]]:
    """``netns(count)`` makes that many connected network namespaces (see ``tests/netns.py``),
    or skips the test saying why it cannot."""
    with _namespace_pool() as pool:

        def make(count: int) -> NetNamespaces:
            reason = unavailable_reason()
            if reason is not None:
                pytest.skip(reason)
            return pool(count)

        yield make


@pytest.fixture
def hosts() -> Iterator[Callable[[int], Loopback | NamespaceHosts]]:
    """``hosts(count)``: real hosts (network namespaces) where they can be made, else the same
    scenario on loopback, with the reason printed in the test report."""
    with _namespace_pool() as pool:

        def make(count: int) -> Loopback | NamespaceHosts:
            reason = unavailable_reason()
            if os.environ.get("PHALANX_TEST_HOSTS") == "loopback":
                reason = "PHALANX_TEST_HOSTS=loopback"
            if reason is not None:
                print(f"running on loopback: {reason}")
                return Loopback()
            return NamespaceHosts(pool(count))

        yield make


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    """Agents a test started (append each ``Node``); every one still running is killed after."""
    started: list[Node] = []
    try:
        yield started
    finally:
        for node in started:
            node.kill()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """Simulated rendezvous agents on one in-memory store (``memcluster``); all shut down after."""
    c = Cluster()
    try:
        yield c
    finally:
        c.shutdown()
