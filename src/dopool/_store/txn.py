"""What a transaction is to the code that runs inside one."""

from typing import Any

# An lmdb.Transaction. lmdb ships no type hints, so this is the one place that says
# so: every module that takes a transaction names it ``Txn``, from here.
Txn = Any
