import sys

from phalanx.cli.main import main

sys.exit(main())
