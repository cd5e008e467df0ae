"""examples/starlette-orders: a Starlette app that enqueues with ``await`` through
``dopool.connect``, tested with Starlette's test client, and the pools a worker runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("starlette")

from starlette.testclient import TestClient

from dopool import Runtime

EXAMPLE = Path(__file__).parents[2] / "examples" / "starlette-orders"
TIMEOUT = 30.0


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"starlette_orders_{name}", EXAMPLE / f"{name}.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch, store_path: Path) -> tuple[ModuleType, ModuleType]:
    """The example's modules (app and order_pools), its store the test's."""
    monkeypatch.setenv("DOPOOL_STORE", str(store_path))
    monkeypatch.setattr(sys, "path", [str(EXAMPLE), *sys.path])
    monkeypatch.delitem(sys.modules, "order_pools", raising=False)  # app.py imports it anew
    return load("app"), load("order_pools")


def test_orders_are_enqueued_awaited_read_cancelled_and_then_run(
    example: tuple[ModuleType, ModuleType], store_path: Path
) -> None:
    app, tasks = example
    with Runtime(store_path) as runtime:  # the first worker creates the store
        tasks.pools(runtime)
    with TestClient(app.make_app(str(store_path))) as client:
        placed = client.post("/orders", json={"id": "o-1", "customer": "ann"})
        assert placed.status_code == 202, placed.text
        event_id = placed.json()["event_id"]
        assert placed.json()["duplicate"] is False
        again = client.post("/orders", json={"id": "o-1", "customer": "ann"})
        assert again.json() == {"event_id": event_id, "duplicate": True}
        assert client.get(f"/orders/{event_id}").json() == {"state": "pending", "attempts": 0}
        dropped = client.post("/orders", json={"id": "o-2", "customer": "bob"}).json()
        assert client.delete(f"/orders/{dropped['event_id']}").json() == {"cancelled": True}
        assert client.delete(f"/orders/{dropped['event_id']}").status_code == 409
        assert client.post("/orders", json={"id": 3}).status_code == 400
        assert client.get("/orders/orders:0:999").status_code == 404
        assert client.get("/orders/not-an-id").status_code == 404
    with Runtime(store_path) as runtime:  # a worker runs what the web app stored
        tasks.pools(runtime)
        assert runtime.pools["orders"].join(timeout=TIMEOUT)
        assert runtime.pools["receipts"].join(timeout=TIMEOUT)
        assert runtime.pools["receipts"].status().succeeded == 1
    with TestClient(app.make_app(str(store_path))) as client:
        assert client.get(f"/orders/{event_id}").json() == {"state": "succeeded", "attempts": 1}
