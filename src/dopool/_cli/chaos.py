"""``dopool chaos``: the chaos harness's own click command (:mod:`dopool._chaos.harness`),
which ``python -m chaos`` runs too, so that both read the same flags."""

from __future__ import annotations

from dopool._chaos.harness import chaos

__all__ = ["chaos"]
