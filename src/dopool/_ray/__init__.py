"""Pools across the nodes of a Ray cluster (``dopool.ray``): a shard host per node, the
placement record, and the producer; Ray imported only when a deployment is made or
joined. It may import every layer below the command line's (the app loader of
``_ops/``, and the simulator's Ray import and its errors, ``_sim/executors.py``).
"""
