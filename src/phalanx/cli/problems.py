"""Usage problems collected while converting a command line, reported all at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Problems:
    """Every usage problem found so far. ``parse`` runs one parser and, when it fails, records
    the message and returns ``fallback``, so the rest of the command line is still checked."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def parse(self, parser: Callable[[], T], fallback: T) -> T:
        try:
            return parser()
        except ValueError as exc:
            self.found.append(str(exc))
            return fallback

    def add(self, problem: str) -> None:
        if problem not in self.found:  # the rendezvous check may repeat one of ours
            self.found.append(problem)
