"""``python -m dopool`` is the ``dopool`` command line (it needs the ``cli`` extra)."""

from dopool._cli import main

if __name__ == "__main__":
    main()
