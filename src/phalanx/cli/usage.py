"""How ``phalanx --help`` reads: the usage line with the subcommands, every option's default,
and "did you mean" for a near miss (an option, a subcommand, an ``--rdzv-conf`` key)."""

from __future__ import annotations

import argparse

from phalanx.parsing import did_you_mean

__all__ = ["SUBCOMMAND_NAMES", "USAGE", "HelpFormatter", "did_you_mean"]

# The subcommands (``cli.main`` maps each to its module); ``help`` prints this usage.
SUBCOMMAND_NAMES = (
    "stacks", "status", "logs", "stop", "ls", "clean", "timeline", "check", "help",
)  # fmt: skip

USAGE = f"""\
phalanx [options] training_script [script args ...]
       phalanx {{{",".join(SUBCOMMAND_NAMES)}}} ...   (a subcommand; -h for its help)
       phalanx --version
(a script named like a subcommand runs as ./NAME, or after --: phalanx -- status)"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description and epilog as written; every option's help ends with its default,
    unless the help text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or "default" in text.lower()
            or action.default is argparse.SUPPRESS
            or isinstance(action, argparse._VersionAction)
        ):
            return text
        default = action.default
        if default is None:
            return f"{text} (default: none)"
        if isinstance(default, list):
            default = ",".join(default) or "none"
        elif default == "":
            default = "none"
        return f"{text} (default: {str(default).replace('%', '%%')})"
