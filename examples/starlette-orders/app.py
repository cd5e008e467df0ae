"""A Starlette app that enqueues with ``await``: the web half of a deployment whose
workers run ``dopool worker examples/starlette-orders/order_pools.py:pools`` on the same store.

    DOPOOL_STORE=./orders-store uvicorn --app-dir examples/starlette-orders app:app

(``--app-dir`` puts this folder on the path: ``order_pools`` holds the options the pool's
handle shares with the workers.)

Each web process opens one connection to the store (``dopool.connect``, as a producer:
it runs no handler) for its life (Starlette's lifespan), waiting up to 30 s for the
first worker to create the store. ``POST /orders`` stores the order and answers 202 with
its event id once it is durable; the loop serves other requests while the commit waits
(``enqueue_async``). ``GET /orders/{id}`` reads the event's state, and
``DELETE /orders/{id}`` cancels one that has not started.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from order_pools import ORDERS  # the pool's options, as the workers define it
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import dopool


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    with dopool.connect(app.state.store, wait=30.0) as connection:
        app.state.orders = connection.pool("orders", **ORDERS)
        yield


async def create(request: Request) -> JSONResponse:
    order: dict[str, Any] = await request.json()
    if not isinstance(order.get("id"), str) or not isinstance(order.get("customer"), str):
        return JSONResponse({"error": "an order needs a string id and customer"}, 400)
    result = await request.app.state.orders.enqueue_async(
        order, partition_key=order["customer"], dedup_key=f"order-{order['id']}"
    )
    return JSONResponse({"event_id": result.event_id, "duplicate": result.duplicate}, 202)


async def show(request: Request) -> JSONResponse:
    try:
        info = await request.app.state.orders.event_async(request.path_params["event_id"])
    except dopool.EventIdError:
        info = None
    if info is None:
        return JSONResponse({"error": "no such order"}, 404)
    return JSONResponse({"state": info.state, "attempts": info.attempts})


async def cancel(request: Request) -> JSONResponse:
    try:
        cancelled = await request.app.state.orders.cancel_async(request.path_params["event_id"])
    except dopool.EventIdError:
        cancelled = False
    return JSONResponse({"cancelled": cancelled}, 200 if cancelled else 409)


def make_app(store: str) -> Starlette:
    routes = [
        Route("/orders", create, methods=["POST"]),
        Route("/orders/{event_id}", show, methods=["GET"]),
        Route("/orders/{event_id}", cancel, methods=["DELETE"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.store = store
    return app


app = make_app(os.environ.get("DOPOOL_STORE", "./orders-store"))
