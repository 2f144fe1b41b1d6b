from phalanx.cli.main import command

command()
