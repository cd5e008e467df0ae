"""Time, and how actors run.

The clocks (real and simulated, :mod:`.clocks`) and the actor backends they choose
(threads, :mod:`.backend`; greenlets, :mod:`.greenlets`), with what actors wait on:
their inboxes, quiescence and a first-come, first-served lock. The lowest layer
above the leaves: it imports nothing else of dopool's.
"""
