"""What your own tests of code that uses dopool need: virtual time and planned faults.

``SimulatedClock`` runs a runtime in virtual time (``Runtime.simulated`` makes one with
it), ``FaultPlan`` crashes its instances at seeded places, and a simulation that can
no longer move raises ``SimulationStalledError``. The same names stay importable where
they were (``dopool.SimulatedClock``, ``dopool.chaos.FaultPlan``,
``dopool.SimulationStalledError``): these are the same objects.
"""

from dopool._clock.clocks import SimulatedClock
from dopool._errors import SimulationStalledError
from dopool.chaos import FaultPlan

__all__ = ["FaultPlan", "SimulatedClock", "SimulationStalledError"]
