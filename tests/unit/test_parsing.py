"""Pure parsers, as parametrized tables."""

from __future__ import annotations

import pytest

from phalanx import parsing


@pytest.mark.parametrize(
    ("text", "expected"), [("1", (1, 1)), ("4", (4, 4)), ("1:2", (1, 2)), ("2:8", (2, 8))]
)
def test_nnodes(text: str, expected: tuple[int, int]) -> None:
    assert parsing.parse_nnodes(text) == expected


@pytest.mark.parametrize("text", ["0", "x", "3:2", "1:2:3", "", "-1:2", "1:"])
def test_nnodes_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="--nnodes"):
        parsing.parse_nnodes(text)


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("node0", "node0", None),
        ("node0:29400", "node0", 29400),
        ("10.1.2.3:1", "10.1.2.3", 1),
        ("[::1]:29500", "::1", 29500),
        ("[fe80::2]", "fe80::2", None),
    ],
)
def test_endpoint(text: str, host: str, port: int | None) -> None:
    assert parsing.parse_endpoint(text) == parsing.Endpoint(host, port)


@pytest.mark.parametrize("text", ["a:b:c", "host:port", "host:70000", ":29400", "", "[::1]:x"])
def test_endpoint_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        parsing.parse_endpoint(text)


@pytest.mark.parametrize(
    ("text", "nproc", "expected"),
    [
        ("0", 2, {0: frozenset(), 1: frozenset()}),
        ("3", 1, {0: frozenset({"stdout", "stderr"})}),
        ("0:1,1:2", 3, {0: frozenset({"stdout"}), 1: frozenset({"stderr"}), 2: frozenset()}),
    ],
)
def test_std_spec(text: str, nproc: int, expected: dict[int, frozenset[str]]) -> None:
    assert parsing.parse_std_spec(text, "-r", nproc) == expected


def test_kv_list_and_filters() -> None:
    assert parsing.parse_kv_list("a=1, b = two,", "--rdzv-conf") == {"a": "1", "b": "two"}
    # quotes around the whole list (a shell quoting passed on literally) are not the keys'
    assert parsing.parse_kv_list("'a=1,b=2'", "--rdzv-conf") == {"a": "1", "b": "2"}
    assert parsing.parse_kv_list('"a=1"', "--rdzv-conf") == {"a": "1"}
    assert parsing.parse_kv_list("a='1'", "--rdzv-conf") == {"a": "'1'"}
    assert parsing.parse_filter_words("loss,,acc,epoch") == ("loss,acc", "epoch")
    assert parsing.parse_rank_list("0,2", "--local-ranks-filter") == frozenset({0, 2})
