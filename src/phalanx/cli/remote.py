"""``python -m phalanx.cli.remote AGENT-ARGS``: the normal phalanx agent, on a host the
controller reached over ssh, holding the lifeline (``hosts.lifeline``) on its stdin."""

from __future__ import annotations

import sys

from phalanx.cli.main import main as cli_main
from phalanx.hosts.lifeline import Lifeline


def main() -> int:
    Lifeline.from_stdin().start()
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
