"""Evidence about live processes, read from outside them (``/proc`` and probe state)."""
