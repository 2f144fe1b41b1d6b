"""The launcher's command line read: argv -> ``Launch`` (and its config).

Shared by ``main`` (the run) and the subcommands that take the job's flags (``check``), so
neither has to import the other.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from phalanx.cli import abbrev
from phalanx.cli.convert import to_launch
from phalanx.cli.parser import build_parser
from phalanx.cli.scheduler import derive
from phalanx.config import LaunchConfig
from phalanx.launch import Launch


def read_launch(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], Launch]:
    """``argv`` spelled out (``expanded``) and read as a launch (``parse_launch``), with one
    parser built for both: a launch's own start is on its critical path."""
    parser = build_parser(environ)
    spelled = abbrev.expand(parser, argv)
    return spelled, parse_launch(spelled, environ, parser)


def parse_launch(
    argv: Sequence[str], environ: Mapping[str, str], parser: argparse.ArgumentParser | None = None
) -> Launch:
    """``argv`` (torchrun's abbreviations spelled out already: ``expanded``) as a launch;
    ``parser``: ``build_parser(environ)``, if already built."""
    ns = (parser or build_parser(environ)).parse_args(list(argv))
    ns, derivation = derive(ns, argv, environ)
    return to_launch(ns, environ, derivation=derivation)


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> LaunchConfig:
    """``argv`` as a config (``parse_launch``'s)."""
    return parse_launch(argv, environ).config


def expanded(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """``argv`` with the launcher's abbreviated flags spelled out (``cli.abbrev``)."""
    return abbrev.expand(build_parser(environ), argv)
