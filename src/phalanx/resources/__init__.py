"""What a run takes from its host, checked before use: the process limits (``limits``), the
private run directory (``rundir``), a free port (``ports``)."""
