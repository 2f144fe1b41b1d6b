"""``phalanx timeline``: a run's events drawn as lanes per rank, or summed up in a few lines."""

from phalanx.timeline.model import Timeline, build
from phalanx.timeline.page import render
from phalanx.timeline.summary import summarize

__all__ = ["Timeline", "build", "render", "summarize"]
