from popplay.cli import entry_point

entry_point()
