"""The documentation site (docs/, mkdocs.yml): it builds with warnings as errors, its
generated pages match the code they come from, every error message in src/ is on the
troubleshooting page, and every block of a tutorial marked ``<!-- runnable -->`` runs, in
order, on this CPU with Gloo, as a reader would run it from a checkout.

Markers (an HTML comment on the line before a fenced block, invisible on the site):
``<!-- runnable -->`` before a ``bash`` block runs it (``exit=N``: the exit status it must
end with, else 0); ``<!-- runnable file=NAME -->`` before a ``python`` block writes it to
NAME for the blocks after it."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "scripts"))

import anchors  # noqa: E402
import gen_api  # noqa: E402
import gen_cli  # noqa: E402
import messages  # noqa: E402

# One scan of src/ (some seconds) for every test that reads the messages.
_scan = functools.cache(messages.scan)

TUTORIALS = sorted((DOCS / "tutorials").glob("*.md"))
BLOCK = re.compile(r"<!-- runnable(?P<opts>[^>]*) -->\n```(?P<lang>\w+)\n(?P<code>.*?)\n```\n", re.S)


def runnable_blocks(page: Path) -> list[tuple[dict[str, str], str, str]]:
    """(options, language, code) of each marked block, in the page's order."""
    return [
        (dict(o.split("=", 1) for o in m["opts"].split()), m["lang"], m["code"])
        for m in BLOCK.finditer(page.read_text())
    ]


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "troubleshooting" / "index.html").is_file()
    assert (tmp_path / "site" / "search" / "search_index.json").is_file()


def test_the_cli_reference_is_the_parsers() -> None:
    """Regenerate with: python docs/scripts/gen_cli.py > docs/reference/cli.md"""
    assert (DOCS / "reference" / "cli.md").read_text() == gen_cli.render()


def test_the_python_api_reference_is_the_docstrings() -> None:
    """Regenerate with: python docs/scripts/gen_api.py > docs/reference/python-api.md"""
    assert (DOCS / "reference" / "python-api.md").read_text() == gen_api.render()


def test_every_error_message_is_on_the_troubleshooting_page() -> None:
    """Errors, usage problems, warnings and error log lines, followed to where their text is
    made (``docs/scripts/messages.py``); ``python docs/scripts/messages.py`` lists what the
    page lacks."""
    found = _scan()
    assert len(found.keys) > 250  # the scan still finds the messages (a renamed error class...)
    lacking = _missing((DOCS / "troubleshooting.md").read_text())
    assert lacking == {}, (
        "add to docs/troubleshooting.md, in its section, one line each, written\n"
        "  - `the message`{#its-id}\n"
        "(python docs/scripts/anchors.py --write adds the ids):\n"
        + "\n".join(f"{where}: - `{found.shown[key]}`" for key, where in lacking.items())
    )


def _missing(page: str) -> dict[str, str]:
    return messages.missing(page, _scan())


@pytest.mark.parametrize(
    "shown",
    [
        "…: expected an integer >= …, got …",
        # Told from "--preempt-signals: … cannot be caught ..." by the words it starts with.
        "--signals-to-handle: … cannot be caught by any process",
        # A store's error (not a PhalanxError), printed after "--rdzv-backend static: ".
        "node 0 cannot host the rendezvous store on --master-addr … --master-port …: …",
        "the default log directory …",  # worded by a function: raise _unsafe(...)
        "… sent a malformed reply to …: …",  # its class words it in __init__
        "clean: argument --keep: expected a count >= 0, got …",  # argparse.ArgumentTypeError
    ],
)
def test_the_scan_finds_messages_that_it_once_could_not(shown: str) -> None:
    """Messages once missed (issue 42): each is found in the source and is on the page, and a
    page without its line fails the check above."""
    found = _scan()
    keys = [k for k, text in found.shown.items() if shown.endswith(text) or text == shown]
    assert len(keys) == 1, (shown, keys)
    key = keys[0]
    page = (DOCS / "troubleshooting.md").read_text()
    assert key not in _missing(page)
    # Every entry holding its key: another message may open with the same words (static.py).
    entries = [
        line
        for line in page.splitlines()
        if line.startswith("- `") and (shown in line or key in line)
    ]
    assert entries, shown
    without = "\n".join(line for line in page.splitlines() if line not in entries)
    assert key in _missing(without)


def test_every_troubleshooting_entry_has_its_own_anchor() -> None:
    """Each message line carries the id made from its text (``docs/scripts/anchors.py``),
    so a link goes to that message; ids are unique on the page."""
    page = (DOCS / "troubleshooting.md").read_text()
    found = anchors.entries(page)
    assert len(found) > 300
    wrong = anchors.wrong(page)
    assert wrong == [], (
        "write each entry of docs/troubleshooting.md as - `the message`{#its-id} "
        "(python docs/scripts/anchors.py --write adds or corrects them); these should read:\n"
        + "\n".join(f"line {e.line}: {e.written()}" for e in wrong)
    )
    assert len({e.wanted for e in found}) == len(found)


def test_an_entry_without_its_anchor_is_named_with_the_line_to_write() -> None:
    page = "## A section\n\n- `a message with a value … in it`\n- `a message with a value … in it`{#x}\n"
    assert [(e.line, e.written()) for e in anchors.wrong(page)] == [
        (3, "- `a message with a value … in it`{#a-message-with-a-value-in-it}"),
        (4, "- `a message with a value … in it`{#a-message-with-a-value-in-it-2}"),
    ]
    assert anchors.wrong(anchors.write(page)) == []


def test_every_message_the_scan_cannot_read_says_why() -> None:
    """A message whose text the scan cannot follow (an OS error, a signal) is named in
    ``UNKEYED`` with the reason; a new one fails here, and so does an entry for a message
    that is gone."""
    found = _scan()
    unexplained = {u: where for u, where in found.unkeyed.items() if u not in messages.UNKEYED}
    assert unexplained == {}
    assert set(messages.UNKEYED) - found.seen == set()


def test_the_front_pages_two_commands_are_the_readmes() -> None:
    """docs/index.md repeats the README's two commands for readers of the site; .ci/run and
    test_readme.py run the README's, so the copies must not drift from them."""
    marked = re.compile(r"<!-- (main-job|test-command) -->\n(.*?)<!-- /\1 -->", re.S)
    readme = dict(marked.findall((ROOT / "README.md").read_text()))
    front = dict(marked.findall((DOCS / "index.md").read_text()))
    assert set(readme) == {"main-job", "test-command"}
    assert front == readme


def test_every_tutorial_has_a_runnable_block() -> None:
    assert len(TUTORIALS) == 4
    for page in TUTORIALS:
        assert any(lang == "bash" for _, lang, _ in runnable_blocks(page)), page.name


def _reader_environment(tmp_path: Path) -> dict[str, str]:
    """A shell with this suite's phalanx on PATH, its own temporary directory (so phalanx's
    default run directory and 'last' are this test's), and no launcher's variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PHALANX_RDZV_TOKEN")}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")
    return env


@pytest.mark.parametrize("page", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_the_tutorials_runnable_blocks_run(page: Path, tmp_path: Path) -> None:
    work = tmp_path / "checkout"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")  # as run from the repository's root
    env = _reader_environment(tmp_path)
    for options, lang, code in runnable_blocks(page):
        if "file" in options:
            (work / options["file"]).write_text(code + "\n")
            continue
        assert lang == "bash", f"{page.name}: a runnable {lang} block needs file=NAME"
        done = _run_block(code, work, env)
        expected = int(options.get("exit", "0"))
        assert done.returncode == expected, (code, done.stdout[-3000:], done.stderr[-3000:])
        if page.stem == "failure-report" and expected:
            _check_report_fields(Path(env["TMPDIR"]))


def _run_block(code: str, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run one bash block in a process group of its own, and end that whole group after it:
    a block that starts a node in the background (``&``) and timed out used to leave that
    node, or the foreground one, running after the test (``subprocess.run`` kills bash only)."""
    shell = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", code], cwd=work, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = shell.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)  # phalanx's guardians then end the workers
        shell.communicate(timeout=30)
    return subprocess.CompletedProcess(shell.args, shell.returncode, stdout, stderr)


def _check_report_fields(tmp: Path) -> None:
    """Every field of a real failed run's report.json and status.json is on the page."""
    (run,) = [p for p in tmp.glob("phalanx-*/*") if (p / "report.json").is_file()]
    page = (DOCS / "reference" / "files.md").read_text()
    report = json.loads((run / "report.json").read_text())
    status = json.loads((run / "status.json").read_text())
    keys = {*report, *report["root_cause"], *report["recovery"], *status, *status["ranks"][0]}
    keys |= {*report["recovery"]["incidents"][0], *report["recovery"]["nodes"][0]}
    keys |= set(status["last_failure"])
    assert sorted(k for k in keys if f"`{k}`" not in page) == []


def test_the_tests_cite_pages_that_exist() -> None:
    """A test's docstring names the page that makes its promise; the README no longer holds
    those sections (issue 30), so a citation of a README section, or of a page that is not
    there, sends the reader nowhere."""
    cited: dict[str, str] = {}
    stale = []
    for test in sorted((ROOT / "tests").rglob("*.py")):
        text = test.read_text()
        stale += [f"{test.name}: {m}" for m in re.findall(r'README,? "[^"]+"', text)]
        cited |= {page: test.name for page in re.findall(r"docs/[\w/.-]+\.md", text)}
    assert stale == []
    assert {page: name for page, name in cited.items() if not (ROOT / page).is_file()} == {}
