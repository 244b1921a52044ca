from popplay._entry import entry_point

entry_point()
