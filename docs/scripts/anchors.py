"""Each message on the troubleshooting page has an anchor of its own, made from its text, so a
link (from a page, a message, a chat) goes to that message, and the address says which.

An entry is one line of the page::

    - `rendezvous: … at …: …; trying for another … s (join_timeout)`{#rendezvous-at-trying-for-another-s-join_timeout}

the message in backquotes, its id right after them (``attr_list`` puts it on the message),
then, if any, a word on it. The id is ``slug(message)``: the message's words lowercased, every
run of other characters one ``-``, at most ``MAX_ID`` characters (cut at a ``-``); a second
entry with the same id gets ``-2``, a third ``-3`` (in the page's order).

    python docs/scripts/anchors.py           # lists the entries whose id is missing or wrong
    python docs/scripts/anchors.py --write   # adds or corrects them in place
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"
MAX_ID = 80
ENTRY = re.compile(r"^- `(?P<text>[^`]+)`(?:\{#(?P<id>[^}\s]*)\})?(?P<rest>.*)$")


def slug(text: str) -> str:
    """``text``'s id: lowercase words and ``_``, joined by ``-``, cut to ``MAX_ID`` at a ``-``."""
    words = re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-") or "message"
    if len(words) > MAX_ID:
        words = words[:MAX_ID].rsplit("-", 1)[0]
    return words


@dataclass(frozen=True)
class Entry:
    line: int  # 1-based
    text: str  # the message as the page shows it
    id: str | None  # the id the page gives it
    wanted: str  # the id it should have

    def written(self, rest: str = "") -> str:
        """The entry's line as it should be written."""
        return f"- `{self.text}`{{#{self.wanted}}}{rest}"


def entries(page: str) -> list[Entry]:
    """Every message entry of ``page``, with the id it has and the one it should have."""
    seen: dict[str, int] = {}
    found = []
    for number, line in enumerate(page.splitlines(), 1):
        match = ENTRY.match(line)
        if match is None:
            continue
        base = slug(match["text"])
        seen[base] = seen.get(base, 0) + 1
        wanted = base if seen[base] == 1 else f"{base}-{seen[base]}"
        found.append(Entry(number, match["text"], match["id"], wanted))
    return found


def wrong(page: str) -> list[Entry]:
    """The entries whose id is missing or not ``wanted``."""
    return [e for e in entries(page) if e.id != e.wanted]


def write(page: str) -> str:
    """``page`` with every entry's id added or corrected."""
    lines = page.splitlines(keepends=True)
    for entry in wrong(page):
        line = lines[entry.line - 1]
        match = ENTRY.match(line.rstrip("\n"))
        assert match is not None  # it matched when the entry was read
        lines[entry.line - 1] = entry.written(match["rest"]) + line[len(line.rstrip("\n")) :]
    return "".join(lines)


if __name__ == "__main__":
    text = PAGE.read_text()
    if sys.argv[1:] == ["--write"]:
        PAGE.write_text(write(text))
    else:
        for entry in wrong(text):
            print(f"{PAGE.name}:{entry.line}: {entry.written()}")
