"""``python -m chaos``: the same as ``dopool chaos`` (long mode, or ``--seed S`` to replay)."""

from dopool._chaos.harness import main

if __name__ == "__main__":
    raise SystemExit(main())
