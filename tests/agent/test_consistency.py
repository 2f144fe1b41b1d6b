"""The same code on every node, as pure functions: the fingerprint a node publishes (read
from real files and real installed distributions, torch never imported) and the table the
nodes compute from everyone's fingerprints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.agent.checking import SaidArgs
from phalanx.consistency import fingerprint as fpmod
from phalanx.consistency.compare import differing_fields, mismatch_table
from phalanx.consistency.fingerprint import Target, args_field, file_hash, node_fingerprint
from phalanx.consistency.perargs import args_difference
from phalanx.rendezvous.api import NodeInfo
from phalanx.rendezvous.dynamic.members import Arrival, Membership
from support.memcluster import Cluster, form

BASE = {
    "python": "cpython 3.11.7",
    "phalanx": "0.1.0",
    "torch": "2.13.0+cu126",
    "cuda": "12.6",
    "nccl": "nvidia-nccl-cu12 2.26.2",
    "script": "0123456789abcdef",
}
NODES = [NodeInfo(0, "alpha", "10.0.0.1", 1), NodeInfo(1, "beta", "10.0.0.2", 1)]


@pytest.mark.parametrize(
    ("field", "other"),
    [
        ("torch", "2.12.1+cu126"),
        ("cuda", "12.4"),
        ("nccl", "nvidia-nccl-cu12 2.21.5"),
        ("python", "cpython 3.12.3"),
        ("script", "fedcba9876543210"),
    ],
)
def test_one_differing_field_is_named_with_the_node_that_differs(field: str, other: str) -> None:
    table = mismatch_table(NODES, [BASE, {**BASE, field: other}], "HINT")
    assert table is not None
    lines = table.splitlines()
    assert lines[0].endswith(f"(they differ in: {field}):")
    assert lines[1].split() == ["node", "host", "addr", field]
    assert lines[2].split()[:3] == ["0", "alpha", "10.0.0.1"]
    assert BASE[field] in lines[2] and "*" not in lines[2]
    assert lines[3].split()[:3] == ["1", "beta", "10.0.0.2"]
    assert f"*{other}" in lines[3]  # beta's value is the odd one (a tie goes to node 0)
    assert lines[-1] == "HINT"


def test_the_odd_node_is_marked_even_when_it_is_node_0() -> None:
    odd = {**BASE, "torch": "9.9.9"}
    table = mismatch_table([*NODES, NodeInfo(2, "gamma", "10.0.0.3", 1)], [odd, BASE, BASE], "")
    assert table is not None
    rows = table.splitlines()[2:5]
    assert "*9.9.9" in rows[0] and "*" not in rows[1] + rows[2]


def test_equal_nodes_have_no_table_and_one_node_is_never_compared() -> None:
    assert mismatch_table(NODES, [BASE, dict(BASE)], "") is None
    assert mismatch_table(NODES[:1], [], "") is None  # a rendezvous that carries none


def test_a_version_one_node_could_not_read_is_not_a_difference() -> None:
    cpu = {k: v for k, v in BASE.items() if k not in ("cuda", "nccl")}
    assert differing_fields([BASE, cpu]) == []
    # ... but a difference among the nodes that have it still is
    three = [BASE, cpu, {**BASE, "cuda": "11.8"}]
    assert differing_fields(three) == ["cuda"]


def test_a_file_one_node_lacks_is_missing_there_and_fields_come_in_order() -> None:
    a = {**BASE, "file configs/tiny.json": "1111111111111111", "file b.txt": "2"}
    b = {**BASE, "torch": "9.9.9", "script": "3", "file b.txt": "4"}
    assert differing_fields([a, b]) == ["torch", "script", "file b.txt", "file configs/tiny.json"]
    table = mismatch_table(NODES, [a, b], "")
    assert table is not None and "*missing" in table.splitlines()[3]


def test_many_nodes_show_only_the_ones_that_differ() -> None:
    nodes = [NodeInfo(r, f"h{r}", "a", 1) for r in range(40)]
    prints = [BASE] * 40
    prints[17] = {**BASE, "script": "ffffffffffffffff"}
    table = mismatch_table(nodes, prints, "")
    assert table is not None
    rows = table.splitlines()[2:-2]
    assert [r.split()[:2] for r in rows] == [["17", "h17"]]
    assert "and 39 more node(s)" in table


def test_script_arguments_are_no_difference_and_the_line_names_the_ones_that_differ() -> None:
    a = {**BASE, "args": args_field(["--tag", "nodeA", "--lr", "0.1"])}
    b = {**BASE, "args": args_field(["--tag", "nodeB", "--lr", "0.1"])}
    assert differing_fields([a, b]) == [] and mismatch_table(NODES, [a, b], "") is None
    differ = args_difference(NODES, [a, b], 3)
    assert differ is not None
    assert differ.line == (
        "round 3: script arguments differ between the nodes; each runs with its own, as "
        "under torchrun: --tag: nodeA (node 0), nodeB (node 1)"
    )
    assert differ.nodes == [
        {"node": 0, "host": "alpha", "args": ["--tag", "nodeA", "--lr", "0.1"]},
        {"node": 1, "host": "beta", "args": ["--tag", "nodeB", "--lr", "0.1"]},
    ]
    assert args_difference(NODES, [a, dict(a)], 0) is None
    spawned = {**BASE, "args": "per-node"}  # phalanx.spawn: the node rank, by design
    assert args_difference(NODES, [spawned, spawned], 0) is None


def test_arguments_of_other_lengths_or_too_long_to_publish_are_named_by_node() -> None:
    long = ["x" * 2000]
    assert args_field(long).startswith("1 args ")  # its hash: never kilobytes in the store
    a = {**BASE, "args": args_field(["a"])}
    b = {**BASE, "args": args_field(["a", "b c"])}
    c = {**BASE, "args": args_field(long)}
    nodes = [*NODES, NodeInfo(2, "gamma", "10.0.0.3", 1)]
    differ = args_difference(nodes, [a, b, c], 0)
    assert differ is not None
    assert differ.line.endswith(f": [a] (node 0), [a 'b c'] (node 1), [{c['args']}] (node 2)")
    many = [NodeInfo(r, f"h{r}", "a", 1) for r in range(40)]
    tags = [{**BASE, "args": args_field(["--tag", f"t{r % 2}"])} for r in range(40)]
    differ = args_difference(many, tags, 0)
    assert differ is not None
    assert differ.line.endswith(
        "--tag: t0 (node 0, 2, 4, 6, 8, 10, 12, 14 and 12 more), "
        "t1 (node 1, 3, 5, 7, 9, 11, 13, 15 and 12 more)"
    )


def test_a_file_only_some_nodes_arguments_name_is_compared_among_those_only() -> None:
    """A per-node output name whose file the last run left on its node is no difference; a
    file two nodes both name still is, and so is one a node names but lacks."""
    left = {**BASE, "args": args_field(["--out", "a.json"]), "file a.json": "1111"}
    other = {**BASE, "args": args_field(["--out", "b.json"])}
    assert differing_fields([left, other]) == []
    lacking = {**BASE, "args": args_field(["--out", "a.json"])}
    assert differing_fields([left, lacking]) == ["file a.json"]
    changed = {**left, "file a.json": "2222"}
    assert differing_fields([left, changed]) == ["file a.json"]


def test_fingerprint_hashes_the_script_and_the_files_its_arguments_name(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.json").write_text("{}\n")
    (tmp_path / "data").mkdir()
    target = Target(
        "script",
        "train.py",
        ("--config", "configs/tiny.json", "--out=data", "--lr", "0.1", "--vocab=configs/tiny.json"),
    )
    found = node_fingerprint(target, tmp_path)
    tiny = file_hash(tmp_path / "configs" / "tiny.json")
    assert found["script"] == file_hash(tmp_path / "train.py") != tiny
    assert found["file configs/tiny.json"] == tiny  # both spellings name it once
    assert not any(k.startswith("file data") for k in found)  # directories are not hashed
    assert [k for k in found if k.startswith("file ")] == ["file configs/tiny.json"]
    # An argument that is no path (a long inline value) is simply not a file.
    long_arg = Target("script", "train.py", ("--json=" + "x" * 5000, "y" * 300))
    assert not any(k.startswith("file") for k in node_fingerprint(long_arg, tmp_path))
    assert found["python"].startswith(sys.implementation.name)
    assert len(json.dumps(found)) < 400  # hashes, not contents


def test_the_hash_changes_with_one_byte_and_big_files_go_by_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * 1000)
    b.write_bytes(b"x" * 999 + b"y")
    assert file_hash(a) != file_hash(b)
    assert len(file_hash(a)) == 16
    assert file_hash(tmp_path / "nothing") == "missing"
    assert file_hash(tmp_path) == "missing"
    monkeypatch.setattr(fpmod, "MAX_HASHED", 100)
    assert file_hash(a) == "1000 bytes (not hashed)"


def test_a_module_is_found_as_python_m_finds_it_without_importing_it(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    # Importing the package would raise: the fingerprint must not run it.
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n")
    (pkg / "train.py").write_text("print('train')\n")
    (pkg / "__main__.py").write_text("print('main')\n")
    found = node_fingerprint(Target("module", "mypkg.train"), tmp_path)
    assert found["script"] == file_hash(pkg / "train.py")
    found = node_fingerprint(Target("module", "mypkg"), tmp_path)
    assert found["script"] == file_hash(pkg / "__main__.py")
    assert node_fingerprint(Target("module", "no_such_mod"), tmp_path)["script"] == "missing"
    assert "mypkg" not in sys.modules


def test_versions_come_from_the_installed_metadata_never_from_importing_torch(
    tmp_path: Path,
) -> None:
    """A fake torch and NCCL installed before site-packages (dist-info and torch/version.py
    only, as a CUDA wheel lays them out): the versions are read from them, and torch is not
    imported (the real one would be, were it imported)."""
    fake = tmp_path / "site"
    (fake / "torch-9.9.9.dist-info").mkdir(parents=True)
    (fake / "torch-9.9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n"
    )
    (fake / "torch").mkdir()
    (fake / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '9.9.9'\ncuda: Optional[str] = '12.8'\n"
    )
    (fake / "nvidia_nccl_cu12-2.27.3.dist-info").mkdir()
    (fake / "nvidia_nccl_cu12-2.27.3.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nvidia-nccl-cu12\nVersion: 2.27.3\n"
    )
    probe = (
        "import json, sys; from phalanx.consistency.fingerprint import versions; "
        "v = versions(); v['torch imported'] = 'torch' in sys.modules; print(json.dumps(v))"
    )
    path = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    found = json.loads(out)
    assert (found["torch"], found["cuda"], found["nccl"]) == (
        "9.9.9",
        "12.8",
        "nvidia-nccl-cu12 2.27.3",
    )
    assert found["torch imported"] is False


def test_this_cpu_build_has_a_torch_version_and_no_cuda_field() -> None:
    found = fpmod.versions()
    assert found["torch"].startswith("2.")
    assert "cuda" not in found  # torch/version.py says cuda = None: nothing to compare


def test_fingerprints_travel_with_the_membership_in_node_rank_order() -> None:
    a = Arrival("id-a", "alpha", "10.0.0.1", 1, fingerprint={"script": "1"})
    assert Arrival.from_json(json.loads(json.dumps(a.to_json()))) == a
    m = Membership(0, 0, ("id-a",), (NodeInfo(0, "alpha", "x", 1),), ({"script": "1"},))
    assert Membership.from_json(json.loads(json.dumps(m.to_json()))) == m
    old = m.to_json()
    del old["fingerprints"]  # a member record written without them
    assert Membership.from_json(old).fingerprints == ()


def test_every_node_gets_every_members_fingerprint_from_the_rendezvous(cluster: Cluster) -> None:
    """Driving the algorithm on the in-memory store: each node's result carries the same
    fingerprints, aligned with ``nodes`` (so every node computes the same table)."""
    handlers = [
        cluster.node(name, fingerprint={"script": script})
        for name, script in (("alpha", "aaaa"), ("beta", "bbbb"))
    ]
    results = form(*handlers)
    for result in results:
        by_host = {
            n.hostname: fp["script"]
            for n, fp in zip(result.nodes, result.fingerprints, strict=True)
        }
        assert by_host == {"alpha": "aaaa", "beta": "bbbb"}
    assert results[0].fingerprints == results[1].fingerprints


def test_a_no_python_program_is_hashed_from_the_working_directory_or_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    found = node_fingerprint(Target("program", "run.sh"), tmp_path)
    assert found["script"] == file_hash(tmp_path / "run.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trainer").write_text("#!/bin/sh\necho\n")
    (bin_dir / "trainer").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    found = node_fingerprint(Target("program", "trainer"), tmp_path / "elsewhere")
    assert found["script"] == file_hash(bin_dir / "trainer")


def test_files_up_to_64_mib_are_hashed() -> None:
    assert fpmod.MAX_HASHED == 64 * 1024 * 1024


def test_allow_mismatch_is_a_flag_with_help_and_a_pet_fallback(tmp_path: Path) -> None:
    from phalanx.cli.argv import parse_config

    script = str(tmp_path / "train.py")
    Path(script).write_text("")
    assert parse_config([script], {}).checks.allow_mismatch is False
    assert parse_config(["--allow-mismatch", script], {}).checks.allow_mismatch is True
    assert parse_config(["--allow_mismatch", script], {}).checks.allow_mismatch is True
    assert parse_config([script], {"PET_ALLOW_MISMATCH": "1"}).checks.allow_mismatch is True
    help_text = subprocess.run(
        [sys.executable, "-m", "phalanx", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "--allow-mismatch" in help_text and "NCCL" in help_text


def test_per_node_arguments_are_said_again_when_a_difference_comes_back() -> None:
    a = {**BASE, "args": args_field(["--tag", "nodeA"])}
    b = {**BASE, "args": args_field(["--tag", "nodeB"])}
    said = SaidArgs()
    differ = args_difference(NODES, [a, b], 0)
    assert said.news(differ) is True
    assert said.news(args_difference(NODES, [a, b], 1)) is False  # a restart, same nodes
    assert said.news(args_difference(NODES, [a, dict(a)], 2)) is False  # they agree now
    assert said.news(args_difference(NODES, [a, b], 3)) is True  # and differ again
