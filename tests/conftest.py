"""Shared fixtures; the pure tier first; and CI's rule: under ``CI=true`` nothing is skipped.

``tests/unit/`` holds the in-process tests of the pure parts (fakes, the in-memory store);
every other folder, one per layer, starts real processes. The unit tier runs first, so a
plain run fails fast on a pure mistake before it waits on real processes; then the longest
modules, so that under ``--dist loadfile`` none of them starts last (``support/order.py``).

A test skips only where a part it needs is missing here (etcd, py-spy, torchrun, network
namespaces, a memory cgroup). On a developer's machine that is a skip with its reason; in CI
it is an install problem that must fail the run, so the hook below reports every skip as a
failure there, and the ``hosts`` fixture refuses its loopback fallback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Generator, Iterator

import pytest

from support import cpuquota
from support.hosts import Loopback, NamespaceHosts, Node
from support.memcluster import Cluster
from support.netns import NetNamespaces, unavailable_reason
from support.order import start_order
from support.services import end_services

STRICT = os.environ.get("CI") == "true"

# A test run inside a SLURM job or a Kubernetes pod (a CI runner) would otherwise give every
# phalanx it starts default --preempt-signals, turning the SIGTERM that tests send to stop a
# job (exit 143) into a preemption (exit 75). Tests that want a scheduler set it themselves.
for _marker in ("SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST", "PET_PREEMPT_SIGNALS"):
    os.environ.pop(_marker, None)

# A warm service (--keep-warm) outlives the launch that started it, by design. No test gets
# one unless it asks (PET_KEEP_WARM from a developer's shell is dropped); those a session
# starts live in a directory of its own, and are ended when it finishes (pytest_sessionfinish).
os.environ.pop("PET_KEEP_WARM", None)
SERVICE_RUNTIME = tempfile.mkdtemp(prefix="phalanx-test-runtime-")
os.environ["XDG_RUNTIME_DIR"] = SERVICE_RUNTIME


def pytest_sessionfinish(session: pytest.Session) -> None:
    killed = end_services(os.environ)
    shutil.rmtree(SERVICE_RUNTIME, ignore_errors=True)
    if killed:  # a service that did not end when asked: a bug, said where it cannot be missed
        print(f"\nwarm services that had to be SIGKILLed: {killed}", file=sys.stderr)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's --dist loadfile hands out the modules with the most tests first unless
    # told not to; ours are handed out in the order below (support/order.py says why).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Stable: within a module, and among modules of equal weight, pytest's own order stays.
    items.sort(key=lambda item: start_order(item.path))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must have every part: {reason}"


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
                if STRICT:
                    pytest.fail(f"CI=true needs network-namespace hosts: {reason}")
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


@pytest.fixture
def quota() -> Iterator[Callable[[float], cpuquota.CpuQuota]]:
    """``quota(fraction)``: a CPU-quota cgroup (v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``) at
    that fraction of a core, removed after the test (the node check's and the stragglers'
    slow node)."""
    made: list[cpuquota.CpuQuota] = []

    def make(fraction: float) -> cpuquota.CpuQuota:
        reason = cpuquota.unavailable_reason()
        if reason is not None:
            pytest.skip(reason)
        q = cpuquota.CpuQuota(fraction)
        made.append(q)
        q.create()
        return q

    try:
        yield make
    finally:
        for q in made:
            q.destroy()
