"""Multi-process TP / CP / DP checks against the bound engine (see :mod:`.checks`); findings go into the
same report as the in-process properties."""
