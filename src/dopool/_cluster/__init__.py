"""What several processes share through the store, without threads of its own.

Where a pool's instances are served (the routing table), who holds them (leases
and the fencing check), and the machine's transitions made in a transaction of a
process that does not serve the instance. Below the engine, which uses all three.
"""
