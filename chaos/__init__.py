"""The chaos harness's quick mode (``pytest chaos``) and ``python -m chaos``.

The harness itself ships with dopool, in :mod:`dopool._chaos`, so that
``dopool chaos`` can run it from an installed package.
"""
