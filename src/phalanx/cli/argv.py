"""The launcher's command line read: argv -> ``Launch`` (and its config).

Shared by ``main`` (the run) and the subcommands that take the job's flags (``check``), so
neither has to import the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from phalanx.cli import abbrev
from phalanx.cli.convert import to_launch
from phalanx.cli.parser import build_parser
from phalanx.cli.scheduler import derive
from phalanx.config import LaunchConfig
from phalanx.launch import Launch


def parse_launch(argv: Sequence[str], environ: Mapping[str, str]) -> Launch:
    """``argv`` (torchrun's abbreviations spelled out already: ``expanded``) as a launch."""
    ns = build_parser(environ).parse_args(list(argv))
    ns, derivation = derive(ns, argv, environ)
    return to_launch(ns, environ, derivation=derivation)


def parse_config(argv: Sequence[str], environ: Mapping[str, str]) -> LaunchConfig:
    """``argv`` as a config (``parse_launch``'s)."""
    return parse_launch(argv, environ).config


def expanded(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """``argv`` with the launcher's abbreviated flags spelled out (``cli.abbrev``)."""
    return abbrev.expand(build_parser(environ), argv)
