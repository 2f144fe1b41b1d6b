"""The template imports torch only when the job's program would (docs/explanation/design.md,
"Warm start"; ``phalanx.supervisor.reach``), and phalanx's in-script API over torch with it
(``phalanx.checkpoint``, ``phalanx.dist``: a worker that uses them no longer imports them at
every start).

Three real launches, one worker each: a script that imports only the standard library (also
run as ``-m``), and one that reaches torch through a module of its own. Each worker says, before its own imports
run, whether torch and phalanx's checkpoint module were already in ``sys.modules`` (inherited
from the template it was forked from), and the template's log line says what it imported.
"""

from __future__ import annotations

import json

import pytest

from support.launch import run_phalanx

WARM_LINE = "warm start: workers fork from template pid"
HEAD = (
    "import json, sys\n"
    'print(json.dumps({m: m in sys.modules for m in ("torch", "phalanx.inscript.checkpoint")}), flush=True)\n'
)
PROGRAMS = {
    "free.py": HEAD + "import os, time\nimport helper\n",
    "helper.py": "import json\n",
    "trains.py": HEAD + "import model\nprint(model.total)\n",
    "model.py": "import layers\ntotal = layers.total\n",
    "layers.py": "import torch\ntotal = int(torch.ones(2).sum())\n",
}


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, str]]:
    """script -> (the worker's stdout, phalanx's stderr, the template's log)."""
    root = tmp_path_factory.mktemp("preload")
    for name, text in PROGRAMS.items():
        (root / name).write_text(text)
    found = {}
    for script in ("free.py", "-m free", "trains.py"):
        logs = root / f"logs-{script.replace(' ', '')}"
        args = ["--nproc-per-node", "1", "--log-dir", str(logs), *script.split()]
        result = run_phalanx(args, cwd=root)
        assert result.returncode == 0, result.stderr
        (run_dir,) = logs.iterdir()
        found[script] = (result.stdout, result.stderr, (run_dir / "template.log").read_text())
    return found


@pytest.mark.parametrize("how", ["free.py", "-m free"])
def test_a_script_that_never_imports_torch_forks_from_a_template_without_it(
    launches: dict[str, tuple[str, str, str]], how: str
) -> None:
    stdout, stderr, template_log = launches[how]
    assert json.loads(stdout.split("]: ", 1)[1].splitlines()[0]) == {
        "torch": False,
        "phalanx.inscript.checkpoint": False,
    }
    assert f"{WARM_LINE}" in stderr
    assert "(nothing imported: the program never imports torch)" in stderr
    assert ": imported no module in " in template_log, template_log


def test_a_script_that_imports_torch_through_its_own_module_gets_it_preloaded(
    launches: dict[str, tuple[str, str, str]],
) -> None:
    stdout, stderr, template_log = launches["trains.py"]
    lines = [line.split("]: ", 1)[1] for line in stdout.splitlines()]
    assert lines == ['{"torch": true, "phalanx.inscript.checkpoint": true}', "2"]
    assert f"{WARM_LINE}" in stderr and "imports took" in stderr
    imported = ": imported torch, phalanx.inscript.dist, phalanx.inscript.checkpoint in "
    assert imported in template_log, template_log
