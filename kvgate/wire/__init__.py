"""The shared wire layer: what crosses the network and is used by more than one part.

It imports nothing of kvgate's own packages (``gateway``, ``epp``, ``backends``, ``loadtest``,
``policies``); they import it.
"""
