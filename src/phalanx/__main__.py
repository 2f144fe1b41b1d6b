from phalanx.cli.main import entry

entry()
