"""Running a store in production, without the simulator.

``dopool worker``'s loop, a user's app loaded, ``dopool check``, a store read
from outside its runtime (``dopool status``, ``dead-letters``), and ``dopool
dashboard``'s server.
"""
