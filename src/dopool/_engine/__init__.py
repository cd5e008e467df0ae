"""The actors that run the queue machine.

Instance shells and actors (each started when first used), mailboxes, supervisors, the
router actor, calls and their wait-for graph, the handler's context, and the threads
that keep leases and hear wake-ups from other processes.
"""
