"""The queue machine: every transition of an instance's stored state.

Pure: no actors, no threads, no waiting. Each transition runs inside a write
transaction the caller holds and reports what it did as effects for the caller to
publish. Imports only the store, the clock layer and the leaves.
"""
