"""Rendezvous tier (a): pure functions -- --rdzv-conf settings, endpoints, spec checks, ranks."""

from __future__ import annotations

import pytest

from phalanx.errors import UsageError
from phalanx.rendezvous import registry
from phalanx.rendezvous.dynamic.members import Arrival, assign_ranks
from phalanx.rendezvous.registry import BACKENDS, create_handler, spec_problems
from phalanx.rendezvous.settings import (
    SETTINGS_KEYS,
    RendezvousSettings,
    known_keys,
    parse_settings,
    unused_keys,
)
from phalanx.rendezvous.spec import RendezvousSpec, split_endpoint

DEFAULTS = RendezvousSettings()


@pytest.mark.parametrize(
    ("conf", "field", "value"),
    [
        ({}, "join_timeout", 600.0),
        ({}, "last_call_timeout", 3.0),
        ({"join_timeout": "30"}, "join_timeout", 30.0),
        ({"last_call_timeout": "0.5"}, "last_call_timeout", 0.5),
        ({"close_timeout": "7"}, "close_timeout", 7.0),
        ({"keep_alive_interval": "2"}, "heartbeat_interval", 2.0),
        ({"heartbeat_interval": "2"}, "heartbeat_interval", 2.0),
        ({"heartbeat_timeout": "20"}, "heartbeat_timeout", 20.0),
        ({"keep_alive_max_attempt": "4"}, "heartbeat_timeout", 4.0),
        ({"keep_alive_interval": "3", "keep_alive_max_attempt": "5"}, "heartbeat_timeout", 15.0),
        ({"read_timeout": "9"}, "read_timeout", 9.0),
        ({"exit_barrier_timeout": "12"}, "exit_barrier_timeout", 12.0),
    ],
)
def test_settings(conf: dict[str, str], field: str, value: float) -> None:
    assert getattr(parse_settings(conf), field) == value


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"join_timout": "5"}, "unknown key for c10d; did you mean join_timeout. .known: "),
        ({"join_timeout": "soon"}, "join_timeout=soon: expected a positive number"),
        ({"last_call_timeout": "0"}, "expected a positive number"),
        ({"read_timeout": "inf"}, "expected a positive number"),
        ({"heartbeat_timeout": "9", "keep_alive_max_attempt": "3"}, "not both"),
        ({"keep_alive_max_attempt": "0"}, "expected a positive integer"),
        ({"heartbeat_interval": "5", "heartbeat_timeout": "6"}, "at least twice"),
    ],
)
def test_settings_rejects(conf: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_settings(conf)


def test_timeout_is_join_timeout_where_torchrun_reads_it_so() -> None:
    """torchrun's static and etcd handlers wait ``timeout``; its c10d and etcd-v2 handlers
    never read it, so there it is accepted beside join_timeout and not used."""
    for backend in ("static", "etcd"):
        assert parse_settings({"timeout": "45"}, backend).join_timeout == 45.0
        with pytest.raises(UsageError, match="sets join_timeout twice"):
            parse_settings({"timeout": "5", "join_timeout": "6"}, backend)
    for backend in ("c10d", "etcd-v2"):
        both = parse_settings({"timeout": "5", "join_timeout": "6"}, backend)
        assert both.join_timeout == 6.0
        assert parse_settings({"timeout": "45"}, backend).join_timeout == 600.0
        assert unused_keys({"timeout": "5"}, backend) == [
            f"--rdzv-conf timeout: accepted as torchrun does, not used ({backend} never reads it)"
        ]


def test_unknown_key_lists_every_known_key() -> None:
    with pytest.raises(UsageError) as info:
        parse_settings({"bogus": "1", "join_timeout": "x"})
    assert len(info.value.problems) == 2  # every problem at once
    unknown = next(p for p in info.value.problems if "bogus" in p)
    for key in known_keys("c10d", ()):
        assert key in unknown
    assert "etcd_prefix" not in unknown and "etcd_prefix" in SETTINGS_KEYS  # etcd's only


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ("localhost", 29400)),
        ("node0", ("node0", 29400)),
        ("node0:1234", ("node0", 1234)),
        ("10.213.0.1:29500", ("10.213.0.1", 29500)),
        ("[::1]:29500", ("::1", 29500)),
        ("[fd00::7]", ("fd00::7", 29400)),
    ],
)
def test_split_endpoint(text: str, expected: tuple[str, int]) -> None:
    assert split_endpoint(text, 29400) == expected


@pytest.mark.parametrize("text", ["a:b:c", "host:port", "host:99999", "[::1]:x"])
def test_split_endpoint_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        split_endpoint(text, 29400)


def spec(**changes: object) -> RendezvousSpec:
    base: dict[str, object] = {
        "backend": "c10d",
        "run_id": "job1",
        "min_nodes": 1,
        "max_nodes": 2,
        "endpoint": "node0:29400",
    }
    base.update(changes)
    return RendezvousSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"backend": "zookeeper"},
            "unknown backend 'zookeeper'; known: c10d, etcd, etcd-v2, static",
        ),
        ({"conf": {"is_host": "maybe"}}, "is_host=maybe: expected true or false"),
        ({"conf": {"store_type": "file"}}, "store_type=file"),
        ({"conf": {"nope": "1"}}, "--rdzv-conf nope: unknown key for c10d"),
        ({"endpoint": "a:b:c"}, "--rdzv-endpoint"),
        ({"run_id": "a/b"}, "--rdzv-id 'a/b'"),
        ({"min_nodes": 3, "max_nodes": 2}, "expected 1 <= MIN <= MAX"),
        ({"backend": "static", "node_rank": None}, "static rendezvous needs this node's rank"),
        ({"backend": "static", "node_rank": 0}, "static rendezvous needs a fixed node count"),
        ({"backend": "static", "node_rank": 2, "min_nodes": 2}, "expected 0..1"),
        ({"backend": "static", "node_rank": 0, "conf": {"is_host": "1"}}, "unknown key for static"),
    ],
)
def test_spec_problems(changes: dict[str, object], message: str) -> None:
    _, problems = spec_problems(spec(**changes))
    assert any(message in p for p in problems), problems


def test_spec_fine_and_usage_error_lists_all() -> None:
    assert spec_problems(spec(conf={"is_host": "false", "join_timeout": "5"}))[1] == []
    assert spec_problems(spec(backend="static", node_rank=1, min_nodes=2))[1] == []
    with pytest.raises(UsageError) as info:
        create_handler(spec(conf={"x": "1", "last_call_timeout": "-1"}, run_id="a b"))
    assert len(info.value.problems) == 3


def test_registry_names() -> None:
    assert set(BACKENDS) == {"c10d", "static", "etcd", "etcd-v2"}


def arrival(
    name: str,
    prev_rank: int = -1,
    prev_round: int = -1,
    fixed: int | None = None,
    host: bool = False,
) -> Arrival:
    return Arrival(name, name, name, 1, prev_rank, prev_round, fixed, hosts_store=host)


@pytest.mark.parametrize(
    ("arrivals", "ranks"),
    [
        ([arrival("a"), arrival("b"), arrival("c")], [0, 1, 2]),  # arrival order
        ([arrival("a", 2, 0), arrival("b", 0, 0), arrival("c", 1, 0)], [2, 0, 1]),  # kept
        ([arrival("a", 0, 0), arrival("c", 2, 0)], [0, 1]),  # b lost: c moves down
        ([arrival("b", 1, 0), arrival("c", 2, 0)], [1, 0]),  # a lost: b keeps 1
        ([arrival("new"), arrival("a", 0, 3), arrival("b", 1, 3)], [2, 0, 1]),  # newcomer last
        ([arrival("old", 0, 1), arrival("a", 0, 3)], [1, 0]),  # the newer round's holder wins
        ([arrival("a"), arrival("host", host=True)], [1, 0]),  # the store's host first
        ([arrival("a", 0, 2), arrival("host", host=True)], [0, 1]),  # but a kept rank stays
    ],
)
def test_assign_ranks(arrivals: list[Arrival], ranks: list[int]) -> None:
    assert assign_ranks(arrivals) == ranks


def test_assign_fixed_ranks() -> None:
    assert assign_ranks([arrival("b", fixed=1), arrival("a", fixed=0)]) == [1, 0]
    with pytest.raises(ValueError, match="--node-rank 1 was given to more than one node"):
        assign_ranks([arrival("b", fixed=1), arrival("a", fixed=1)])
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        assign_ranks([arrival("b", fixed=2), arrival("a", fixed=0)])


@pytest.mark.parametrize("name", sorted(registry.BACKENDS))
def test_a_backends_keys_are_known_without_loading_it(name: str) -> None:
    """``conf_keys`` reads a light module (a one-node launch checks its keys without
    importing the backend): the same keys as the backend's own."""
    assert registry.conf_keys(name) == registry.load_backend(name).keys
