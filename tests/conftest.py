"""Shared fixtures."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from hosts import Loopback, NamespaceHosts, Node
from netns import NetNamespaces, unavailable_reason


@pytest.fixture
def netns() -> Iterator[Callable[[int], NetNamespaces]]:
    """``netns(count)`` makes that many connected network namespaces (see ``tests/netns.py``),
    or skips the test saying why it cannot. Everything made is removed at teardown, even
    when the test fails; the test must end the processes it started inside them first."""
    made: list[NetNamespaces] = []

    def make(count: int) -> NetNamespaces:
        reason = unavailable_reason()
        if reason is not None:
            pytest.skip(reason)
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
def hosts() -> Iterator[Callable[[int], Loopback | NamespaceHosts]]:
    """``hosts(count)``: real hosts (network namespaces) where they can be made, else the same
    scenario on loopback, with the reason printed in the test report."""
    made: list[NetNamespaces] = []

    def make(count: int) -> Loopback | NamespaceHosts:
        reason = unavailable_reason()
        if os.environ.get("PHALANX_TEST_HOSTS") == "loopback":
            reason = "PHALANX_TEST_HOSTS=loopback"
        if reason is not None:
            print(f"running on loopback: {reason}")
            return Loopback()
        spaces = NetNamespaces(count)
        made.append(spaces)
        spaces.create()
        return NamespaceHosts(spaces)

    try:
        yield make
    finally:
        for spaces in made:
            spaces.destroy()
            assert spaces.leftovers() == [], f"namespaces left behind: {spaces.leftovers()}"


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    """Agents a test started (append each ``Node``); every one still running is killed after."""
    started: list[Node] = []
    try:
        yield started
    finally:
        for node in started:
            node.kill()
