"""The simulator behind ``dopool simulate``, and the store inspection behind the CLI.

Private: ``scenario`` (what to run), ``driver`` (running it on the real engine
in virtual time), ``metrics`` (what a run measured), ``plot`` (optional
matplotlib figures) and ``storeview`` (reading a real store read-only). None of
it imports click or rich; only :mod:`dopool._cli` does.
"""
