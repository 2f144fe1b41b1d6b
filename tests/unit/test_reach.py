"""Whether a program may import torch, read from its files (``phalanx.supervisor.reach``).

Each case writes a small program to a temporary directory and asks the scan; nothing of it
is run. The real-process side (what the template then imports) is
``tests/worker/test_warm_preload.py``.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

import pytest

from phalanx.config import LaunchMode, WorkersConfig
from phalanx.supervisor import reach
from phalanx.supervisor.reach import may_import_torch
from phalanx.supervisor.warm import TORCH, template_imports


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def script(tmp_path: Path, files: dict[str, str], env: dict[str, str] | None = None) -> bool:
    """May ``main.py`` among ``files`` import torch (run from ``tmp_path``)?"""
    write(tmp_path, files)
    return may_import_torch("script", "main.py", str(tmp_path), env or {}).may


CASES: dict[str, tuple[dict[str, str], bool]] = {  # files (main.py runs) -> may import torch
    "the standard library only": (
        {"main.py": "import os, sys, json\nfrom collections import deque\nimport os.path\n"},
        False,
    ),
    "torch itself": ({"main.py": "import time\nimport torch\n"}, True),
    "torch.distributed in a function": (
        {"main.py": "def f():\n    import torch.distributed as dist\n"},
        True,
    ),
    "a local chain that stays in the standard library": (
        {"main.py": "import a\n", "a.py": "from b import thing\n", "b.py": "import json\n"},
        False,
    ),
    "a local chain that reaches torch": (
        {
            "main.py": "import a\n",
            "a.py": "from b import thing\n",
            "b.py": "from torch import nn\n",
        },
        True,
    ),
    "a cycle of local modules": (
        {"main.py": "import a\n", "a.py": "import b\n", "b.py": "import a\nimport main\n"},
        False,
    ),
    "a package's relative import that reaches torch": (
        {
            "main.py": "from pkg import run\n",
            "pkg/__init__.py": "from .inner import run\n",
            "pkg/inner.py": "from . import deep\ndef run(): pass\n",
            "pkg/deep.py": "import torch\n",
        },
        True,
    ),
    "a submodule named in from-import": (
        {"main.py": "from pkg import sub\n", "pkg/__init__.py": "", "pkg/sub.py": "import torch\n"},
        True,
    ),
    "a namespace package": (
        {"main.py": "import ns.mod\n", "ns/mod.py": "import sys\n"},
        False,
    ),
    "a third-party package": ({"main.py": "import numpy\n"}, True),
    "a name nobody has": ({"main.py": "import no_such_package_here\n"}, True),
    "a local file shadowing a standard module": (
        {"main.py": "import json\n", "json.py": "import torch\n"},
        True,
    ),
    "import_module with a variable": (
        {"main.py": "import importlib, sys\nimportlib.import_module(sys.argv[1])\n"},
        True,
    ),
    "import_module with a literal": (
        {"main.py": "from importlib import import_module\nimport_module('json')\n"},
        False,
    ),
    "import_module with a literal that is torch": (
        {"main.py": "import importlib\nimportlib.import_module('torch')\n"},
        True,
    ),
    "__import__ with a variable": ({"main.py": "name = 'x'\n__import__(name)\n"}, True),
    "exec": ({"main.py": "exec('import math')\n"}, True),
    "a standard module that imports by data": ({"main.py": "import pickle\n"}, True),
    "runpy": ({"main.py": "import runpy\n"}, True),
    "a syntax error": ({"main.py": "import a\n", "a.py": "def (:\n"}, True),
    "a relative import in the script": ({"main.py": "from . import a\n"}, True),
    "torch only under TYPE_CHECKING": (
        {"main.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"},
        False,
    ),
    "torch in TYPE_CHECKING's else": (
        {"main.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    import torch\n"},
        True,
    ),
    "phalanx's step and heartbeat": (
        {"main.py": "import phalanx\nphalanx.step()\nphalanx.heartbeat()\n"},
        False,
    ),
    "phalanx's errors and pause": ({"main.py": "from phalanx import UsageError, pause\n"}, False),
    # Its function-level ``import torch`` runs only when torch.distributed is in use.
    "phalanx's preempted": ({"main.py": "from phalanx import preempted\n"}, True),
    "phalanx's checkpoint": ({"main.py": "from phalanx import checkpoint\n"}, True),
    "phalanx.dist by attribute": ({"main.py": "import phalanx as p\np.dist.init()\n"}, True),
    "phalanx passed on whole": (
        {"main.py": "import phalanx\nprint(getattr(phalanx, 'x'))\n"},
        True,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_scan(tmp_path: Path, case: str) -> None:
    files, may = CASES[case]
    assert script(tmp_path, files) == may


def test_a_torch_free_answer_says_how_much_it_read(tmp_path: Path) -> None:
    write(tmp_path, {"main.py": "import a\n", "a.py": "import b\n", "b.py": ""})
    answer = may_import_torch("script", "main.py", str(tmp_path), {})
    assert answer == reach.Reach(False, "main.py never imports torch (3 files read)")


def test_the_answer_names_the_file_that_imports_torch(tmp_path: Path) -> None:
    write(tmp_path, {"main.py": "import a\n", "a.py": "import torch.nn\n"})
    why = may_import_torch("script", "main.py", str(tmp_path), {}).why
    assert why == f"{tmp_path / 'a.py'} imports torch.nn"


def test_the_script_directory_not_the_working_directory(tmp_path: Path) -> None:
    # python puts the script's directory first on sys.path, not the working directory.
    write(
        tmp_path,
        {"sub/main.py": "import helper\n", "sub/helper.py": "", "helper.py": "import torch"},
    )
    assert not may_import_torch("script", "sub/main.py", str(tmp_path), {}).may


def test_pythonpath_is_searched_after_the_script_directory(tmp_path: Path) -> None:
    write(tmp_path, {"app/main.py": "import lib\n", "libs/lib.py": "import json\n"})
    cwd = str(tmp_path / "app")
    assert may_import_torch("script", "main.py", cwd, {}).may  # not found: installed?
    env = {"PYTHONPATH": str(tmp_path / "libs")}
    assert not may_import_torch("script", "main.py", cwd, env).may


def test_pythonsafepath_drops_the_script_directory(tmp_path: Path) -> None:
    write(tmp_path, {"main.py": "import helper\n", "helper.py": ""})
    assert not may_import_torch("script", "main.py", str(tmp_path), {}).may
    assert may_import_torch("script", "main.py", str(tmp_path), {"PYTHONSAFEPATH": "1"}).may


@pytest.mark.parametrize(
    ("files", "module", "may"),
    [
        ({"job.py": "import json\n"}, "job", False),
        ({"pkg/__init__.py": "", "pkg/__main__.py": "import pkg.inner\n", "pkg/inner.py": ""},
         "pkg", False),
        ({"pkg/__init__.py": "", "pkg/__main__.py": "from pkg import inner\n",
          "pkg/inner.py": "import torch.distributed\n"}, "pkg", True),
        ({"pkg/__init__.py": "import torch\n", "pkg/job.py": ""}, "pkg.job", True),
        ({"pkg/__init__.py": "", "pkg/job.py": ""}, "pkg.job", False),
        ({}, "json.tool", False),  # a standard module
        ({}, "not_installed_anywhere", True),
    ],
)  # fmt: skip
def test_dash_m(tmp_path: Path, files: dict[str, str], module: str, may: bool) -> None:
    """``-m`` finds the module in the working directory, as python does, without importing it
    (or its packages: an ``__init__`` importing torch is read, not run)."""
    write(tmp_path, files)
    assert may_import_torch("module", module, str(tmp_path), {}).may == may


def test_compiled_code_cannot_be_read(tmp_path: Path) -> None:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    write(tmp_path, {"main.py": "import fast\n", "fast.py": "", f"fast{suffix}": "not ELF"})
    assert script(tmp_path, {})  # python loads the compiled one, not the source beside it
    (tmp_path / f"fast{suffix}").unlink()
    assert not script(tmp_path, {})
    (tmp_path / "fast.py").unlink()
    assert script(tmp_path, {"fast.pyc": ""})


def test_a_missing_script(tmp_path: Path) -> None:
    assert may_import_torch("script", "nowhere.py", str(tmp_path), {}).may
    assert may_import_torch("script", ".", str(tmp_path), {}).may  # a directory


def test_a_file_python_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_bytes(b"import json\x00\n")
    assert may_import_torch("script", "main.py", str(tmp_path), {}).may


def test_the_scan_is_bounded(tmp_path: Path) -> None:
    chain = {f"m{i}.py": f"import m{i + 1}\n" for i in range(reach.MAX_FILES + 5)}
    write(tmp_path, {"main.py": "import m0\n", **chain})
    answer = may_import_torch("script", "main.py", str(tmp_path), {})
    assert answer == reach.Reach(True, f"stopped after {reach.MAX_FILES} files")


def test_a_file_too_big_to_read(tmp_path: Path) -> None:
    big = "x = 0\n" * (reach.MAX_BYTES // 6 + 1)
    assert script(tmp_path, {"main.py": "import big\n", "big.py": big})


def test_what_the_template_imports(tmp_path: Path) -> None:
    """torch (and phalanx's in-script API over it) unless the program never imports it; any
    --preload keeps it."""
    assert TORCH[0] == "torch"
    write(tmp_path, {"free.py": "import time\n", "uses.py": "import torch\n", "job.py": ""})

    def imports(program: str, **fields: object) -> tuple[str, ...]:
        workers = WorkersConfig(program=program, **fields)  # type: ignore[arg-type]
        return template_imports(workers, {}, str(tmp_path))

    assert imports("free.py") == ()
    assert imports("uses.py") == TORCH  # torch and phalanx's in-script API over it
    assert imports("free.py", preload=("json",)) == TORCH
    assert imports("free.py", mode=LaunchMode.RUN_PATH) == ()
    assert imports("job", mode=LaunchMode.MODULE) == ()
    assert imports("uses", mode=LaunchMode.MODULE) == TORCH
