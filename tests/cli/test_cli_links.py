"""Every place phalanx's help sends the reader exists (issue 42: ``--help`` pointed to a README
section that had moved to docs/). The help is read as the user reads it, from the real CLI:
``phalanx --help`` and each subcommand's, unwrapped, so a path never breaks across lines.

What counts as a place: a docs page (``docs/how-to/nodes.md``), with a section after it
(``docs/how-to/nodes.md, "Node check"``) or an anchor (``...md#node-check``), and a README
section (``the README's "X"``). Each page must be a file, each section a heading of it, each
anchor the slug the site gives a heading (mkdocs' toc: lower case, punctuation dropped,
spaces as dashes)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from phalanx.cli.usage import SUBCOMMAND_NAMES
from support.launch import PHALANX

ROOT = Path(__file__).resolve().parents[2]
PAGE = re.compile(
    r'(?P<page>(?:docs/)?[\w./-]+\.md)(?:#(?P<anchor>[\w-]+)|,? "(?P<section>[^"]+)")?'
)
README = re.compile(r'README(?:\'s|,)? "(?P<section>[^"]+)"')


def _help_texts() -> dict[str, str]:
    """Each command's help, unwrapped (argparse wraps at $COLUMNS)."""
    env = {**os.environ, "COLUMNS": "100000"}
    texts = {}
    for name in ["", *(s for s in SUBCOMMAND_NAMES if s != "help")]:
        argv = [*PHALANX, *([name] if name else []), "--help"]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        texts[name or "phalanx"] = done.stdout
    return texts


def _headings(page: Path) -> list[str]:
    return [m[1].strip() for m in re.finditer(r"^#+ (.+)$", page.read_text(), re.M)]


def _slug(heading: str) -> str:
    words = re.sub(r"[^\w\s-]", "", heading.lower()).strip()
    return re.sub(r"[\s]+", "-", words)


def _broken(place: re.Match[str]) -> str | None:
    """Why ``place`` (a PAGE match) sends the reader nowhere, or None."""
    page = ROOT / place["page"]
    if not page.is_file():
        return "no such page"
    headings = _headings(page)
    if place["section"] and place["section"] not in headings:
        return f"no section {place['section']!r} (has {headings})"
    if place["anchor"] and place["anchor"] not in {_slug(h) for h in headings}:
        return f"no anchor #{place['anchor']}"
    return None


def test_every_page_section_and_anchor_the_help_names_exists() -> None:
    broken = []
    seen = 0
    for command, text in _help_texts().items():
        for place in PAGE.finditer(text):
            seen += 1
            if (why := _broken(place)) is not None:
                broken.append(f"phalanx {command} --help: {place[0]}: {why}")
        for place in README.finditer(text):
            seen += 1
            if place["section"] not in _headings(ROOT / "README.md"):
                broken.append(f"phalanx {command} --help: {place[0]}: not a README section")
    assert seen >= 2  # the scan still finds the places the help names
    assert broken == []
