"""The pools of the Starlette example (app.py): what ``dopool worker`` runs.

    dopool worker examples/starlette-orders/order_pools.py:pools --store ./orders-store

``orders`` charges each order, one instance per customer (its partition key), so a
customer's orders run one at a time and in order, and sends a receipt to ``receipts``
as a follow-up, committed with the order's success.
"""

from __future__ import annotations

from dopool import EventContext, RetryPolicy, Runtime


def charge(ctx: EventContext) -> None:
    order = ctx.event
    # A real handler calls the payment provider here (idempotently: an attempt may repeat).
    ctx.enqueue({"receipt_for": order["id"], "to": order["customer"]}, pool="receipts")


def send_receipt(ctx: EventContext) -> None:
    """A real handler sends the email here."""


#: What the web app's handle must be given too (the store does not hold them): an order id
#: is stored once a day, and a finished order stays readable for a day.
ORDERS = {"dedup_window": 86400.0, "keep_finished": 86400.0}


def pools(runtime: Runtime) -> None:
    retry = RetryPolicy(max_attempts=5, initial_delay=1.0)
    # receipts first: orders may start at once, and its follow-ups need their pool.
    runtime.define("receipts", execute=send_receipt, concurrency=2, retry=retry)
    runtime.define("orders", execute=charge, concurrency=8, retry=retry, **ORDERS)
