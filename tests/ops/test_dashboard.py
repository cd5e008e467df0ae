"""``dopool dashboard``: the app through Starlette's TestClient against a real store, the
command's refusals, and the command serving one until SIGTERM (docs/deployment.md,
"Dashboard").

The store is made by a simulated runtime and closed before the dashboard reads it: LMDB
takes one handle on a store per process, and the dashboard opens its own for each
request. The browser drives it beside a live runtime in test_dashboard_browser.py.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import dopool
from cli_support import assert_one_line_error, invoke
from dopool import EventContext, PoolStatus, RetryPolicy, Runtime
from dopool._ops.dashboard import (
    SAMPLE_EVERY,
    TOKEN_HEADER,
    Dashboard,
    DashboardUnavailableError,
    allowed_hosts,
    is_loopback,
    listen,
    make_app,
)

BASE = "http://127.0.0.1:8780"  # what a browser sends as Host: the dashboard's own address
TIMEOUT = 60.0


def poisoned(ctx: EventContext) -> None:
    if ctx.event.get("poison"):
        raise ValueError(f"poisoned event {ctx.event['n']}")


@pytest.fixture
def store(store_path: Path) -> Path:
    """Pool ``jobs`` (6 instances): two dead letters (instances 0 and 1, with tracebacks),
    then paused as a whole with 20 events pending, spread unevenly by partition key; pool
    ``mail`` (2 instances), with a recurring schedule."""
    with Runtime.simulated(store_path) as runtime:
        retry = RetryPolicy(max_attempts=1)
        jobs = runtime.define("jobs", execute=poisoned, concurrency=6, retry=retry)
        mail = runtime.define("mail", execute=poisoned, concurrency=2)
        mail.schedule("tick", {"t": 1}, every=60)
        jobs.enqueue_many([{"poison": True, "n": n} for n in range(2)])
        assert jobs.join(timeout=TIMEOUT)
        jobs.pause()
        for n in range(20):
            jobs.enqueue({"n": n}, partition_key=f"key-{n}")
    return store_path


def status_of(path: Path, pool: str = "jobs") -> PoolStatus:
    with dopool.connect(path) as connection:
        return connection.pool(pool).status()


def client(path: Path, *, control: bool = False, dashboard: Dashboard | None = None) -> TestClient:
    board = dashboard or Dashboard(path, allow_control=control)
    return TestClient(make_app(board), base_url=BASE)


@pytest.fixture
def reader(store: Path) -> Iterator[TestClient]:
    with client(store) as opened:
        yield opened


# -- reading -----------------------------------------------------------------------------


def test_the_overview_is_each_pools_status(store: Path, reader: TestClient) -> None:
    response = reader.get("/api/overview")
    assert response.status_code == 200
    document = response.json()
    assert (document["store"], document["control"]) == (str(store), False)
    assert [pool["name"] for pool in document["pools"]] == ["jobs", "mail"]
    for shown in document["pools"]:
        status = status_of(store, shown["name"])
        for field in (
            "concurrency", "used", "paused", "enqueued", "pending", "scheduled", "succeeded",
            "dead_lettered", "dead_letters_held", "drained", "cancelled", "schedules",
        ):  # fmt: skip
            assert shown[field] == getattr(status, field), (shown["name"], field)
        paused = sum(1 for instance in status.instances if instance.state == "paused")
        assert (shown["paused_instances"], shown["running"]) == (paused, 0)
    jobs = document["pools"][0]
    assert (jobs["pending"], jobs["dead_letters_held"], jobs["paused"]) == (20, 2, True)
    assert jobs["paused_instances"] == 6
    assert jobs["rates"] == {"enqueued": None, "succeeded": None, "dead_lettered": None}
    assert jobs["samples"] == [[0.0, 22, 0, 2, 20]]


def test_rates_come_from_a_sample_at_each_overview(store: Path) -> None:
    """One sample a pool per overview, at most one every SAMPLE_EVERY seconds; the rates
    are over them."""
    clock = [100.0]
    board = Dashboard(store, now=lambda: clock[0])
    with client(store, dashboard=board) as reader:
        reader.get("/api/overview")
        with dopool.connect(store) as connection:
            connection.pool("jobs").enqueue_many([{"n": n} for n in range(10)])
        clock[0] += 4.0
        jobs = reader.get("/api/overview").json()["pools"][0]
        assert jobs["rates"] == {"enqueued": 2.5, "succeeded": 0.0, "dead_lettered": 0.0}
        clock[0] += SAMPLE_EVERY / 2  # too soon for another sample
        jobs = reader.get("/api/overview").json()["pools"][0]
    assert jobs["samples"] == [[4.5, 22, 0, 2, 20], [0.5, 32, 0, 2, 30]]


def test_instances_are_paged_hottest_first(store: Path, reader: TestClient) -> None:
    status = status_of(store)
    hottest = [s.instance_id for s in sorted(status.instances, key=lambda s: (-s.pending, s.index))]
    pending = [status.instance(int(ident.split(":")[1])).pending for ident in hottest]
    assert hottest != sorted(hottest)  # (the store's spread makes the order a test)
    assert len(set(pending)) < len(pending)  # (and ties, broken by index)
    first = reader.get("/api/pools/jobs/instances", params={"per_page": 4}).json()
    second = reader.get("/api/pools/jobs/instances", params={"per_page": 4, "page": 2}).json()
    assert (first["page"], first["pages"], first["total"]) == (1, 2, 6)
    assert [row["instance_id"] for row in first["rows"] + second["rows"]] == hottest
    assert [row["pending"] for row in first["rows"] + second["rows"]] == pending
    assert all(row["state"] == "paused" for row in first["rows"])
    past = reader.get("/api/pools/jobs/instances", params={"per_page": 4, "page": 9}).json()
    assert (past["page"], past["rows"]) == (2, second["rows"])  # the last page
    for params, named in (({"page": 0}, "page"), ({"per_page": 201}, "per_page")):
        refused = reader.get("/api/pools/jobs/instances", params=params)
        assert refused.status_code == 400
        assert refused.json()["error"].startswith(named)
    assert reader.get("/api/pools/jobs/instances?page=two").status_code == 400


def test_dead_letters_carry_their_tracebacks(reader: TestClient) -> None:
    document = reader.get("/api/pools/jobs/dead-letters").json()
    assert document["total"] == 2
    letters = {row["event_id"]: row for row in document["rows"]}
    assert sorted(letters) == ["jobs:0:0", "jobs:1:0"]
    letter = letters["jobs:1:0"]
    assert letter["error"] == "ValueError: poisoned event 1"
    assert letter["traceback"].startswith("Traceback (most recent call last):")
    assert ", in poisoned\n" in letter["traceback"]
    assert letter["traceback"].rstrip().endswith("ValueError: poisoned event 1")
    assert letter["event"] == "{'poison': True, 'n': 1}"
    one = reader.get("/api/pools/jobs/dead-letters", params={"per_page": 1, "page": 2}).json()
    assert [row["event_id"] for row in one["rows"]] == ["jobs:1:0"]


def test_schedules_and_leases(reader: TestClient) -> None:
    (schedule,) = reader.get("/api/schedules").json()["schedules"]
    assert (schedule["pool"], schedule["name"], schedule["every"]) == ("mail", "tick", 60.0)
    assert schedule["event"] == "{'t': 1}"
    assert reader.get("/api/leases").json() == {"leases": []}  # a simulated runtime leases none


def test_an_unknown_pool_is_404_naming_it(store: Path) -> None:
    with client(store, control=True) as reader:
        token = Dashboard(store).token  # (another dashboard's: refused before the pool is)
        for response in (
            reader.get("/api/pools/nope/instances"),
            reader.get("/api/pools/nope/dead-letters"),
        ):
            assert response.status_code == 404
            assert response.json()["pool"] == "nope"
            assert "has no pool 'nope' (pools: 'jobs', 'mail')" in response.json()["error"]
        refused = reader.post("/api/pools/nope/pause", headers={TOKEN_HEADER: token})
        assert refused.status_code == 403


def test_the_page_runs_only_its_own_script_and_sets_store_text_as_text(reader: TestClient) -> None:
    response = reader.get("/")
    assert response.status_code == 200
    policy = response.headers["content-security-policy"]
    nonce = re.search(r"'nonce-([\w-]+)'", policy)
    assert nonce is not None
    assert f'<script nonce="{nonce[1]}">' in response.text
    assert "frame-ancestors 'none'" in policy
    assert response.headers["x-frame-options"] == "DENY"
    assert "innerHTML" not in response.text  # store text is set as text nodes only
    assert 'name="dopool-token" content=""' in response.text  # read-only: no token


# -- control -----------------------------------------------------------------------------


def test_a_read_only_dashboard_refuses_every_control_and_stores_nothing(
    store: Path, reader: TestClient
) -> None:
    before = status_of(store)
    board = Dashboard(store)
    for action in ("pause", "resume", "drain", "redrive", "purge"):
        response = reader.post(f"/api/pools/jobs/{action}", headers={TOKEN_HEADER: board.token})
        assert response.status_code == 403
        assert "--allow-control" in response.json()["error"]
    assert status_of(store) == before


def test_control_needs_the_token_the_page_embeds(store: Path) -> None:
    board = Dashboard(store, allow_control=True)
    with client(store, dashboard=board) as browser:
        page = browser.get("/").text
        assert f'name="dopool-token" content="{board.token}"' in page
        before = status_of(store)
        for headers in ({}, {TOKEN_HEADER: ""}, {TOKEN_HEADER: board.token[:-1]}):
            response = browser.post("/api/pools/jobs/resume", headers=headers)
            assert response.status_code == 403
            assert TOKEN_HEADER in response.json()["error"]
        assert status_of(store) == before
        done = browser.post("/api/pools/jobs/resume", headers={TOKEN_HEADER: board.token})
        assert done.status_code == 200, done.text
        assert done.json()["summary"] == "resumed jobs (6 instances)"
        assert not status_of(store).paused
        done = browser.post(
            "/api/pools/jobs/pause", params={"instance": 2}, headers={TOKEN_HEADER: board.token}
        )
        assert (done.json()["changed"], done.json()["summary"]) == ([2], "paused jobs:2")
        status = status_of(store)
        assert not status.paused
        assert [s.index for s in status.instances if s.state == "paused"] == [2]
        done = browser.post("/api/pools/jobs/pause", headers={TOKEN_HEADER: board.token})
        assert done.json()["summary"] == "paused jobs (5 instances; 1 already paused)"
        assert status_of(store).paused


def test_drain_redrive_and_purge_act_on_the_store(store: Path) -> None:
    board = Dashboard(store, allow_control=True)
    token = {TOKEN_HEADER: board.token}
    with client(store, dashboard=board) as browser:
        done = browser.post("/api/pools/jobs/redrive", params={"instance": 1}, headers=token)
        assert done.json()["summary"] == "redrove 1 of 1 dead letters of jobs:1"
        status = status_of(store)
        assert (status.dead_letters_held, status.pending, status.enqueued) == (1, 21, 23)
        done = browser.post("/api/pools/jobs/purge", headers=token)
        assert (done.json()["matched"], done.json()["done"]) == (1, 1)
        assert status_of(store).dead_letters_held == 0
        assert browser.get("/api/pools/jobs/dead-letters").json()["total"] == 0
        done = browser.post("/api/pools/jobs/drain", params={"instance": 1}, headers=token)
        assert done.json()["summary"] == "drained 3 events from jobs:1"  # 2 pending, 1 redriven
        done = browser.post("/api/pools/jobs/drain", headers=token)
        assert done.json()["drained"] == 18
        status = status_of(store)
        assert (status.pending, status.drained) == (0, 21)
        refused = browser.post("/api/pools/jobs/pause", params={"instance": 6}, headers=token)
        assert refused.status_code == 400
        assert refused.json()["error"] == "pool 'jobs' has no instance 6 (concurrency 6)"
        assert browser.post("/api/pools/jobs/explode", headers=token).status_code == 404
        assert browser.post("/api/pools/nope/pause", headers=token).status_code == 404


def test_a_request_naming_another_host_is_refused(store: Path) -> None:
    """A page of another site whose name an attacker points at 127.0.0.1 (DNS rebinding)
    sends its own name as Host."""
    board = Dashboard(store, allow_control=True)
    with TestClient(make_app(board), base_url="http://attacker.example:8780") as foreign:
        assert foreign.get("/api/overview").status_code == 400
        response = foreign.post("/api/pools/jobs/resume", headers={TOKEN_HEADER: board.token})
        assert response.status_code == 400
    assert status_of(store).paused
    for base in ("http://localhost:8780", "http://127.0.0.1:1"):
        with TestClient(make_app(board), base_url=base) as local:
            assert local.get("/api/overview").status_code == 200
    assert allowed_hosts("::1") == ["127.0.0.1", "[::1]", "localhost"]
    assert "192.0.2.7" in allowed_hosts("192.0.2.7")


# -- the command -------------------------------------------------------------------------


def test_the_command_refuses_a_missing_store_and_creates_none(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = invoke("dashboard", str(missing), "--port", "0")
    assert_one_line_error(result, 1, "no dopool store at", "nowhere")
    assert not missing.exists()


def test_the_command_names_the_missing_extra(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if not installed
    result = invoke("dashboard", str(store))
    assert_one_line_error(result, 1, "uvicorn is missing", "'dashboard' extra", "'.[dashboard]'")
    with pytest.raises(DashboardUnavailableError) as caught:
        make_app(Dashboard(store))
    assert caught.value.missing == "uvicorn"


def test_the_command_refuses_a_port_taken(store: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = invoke("dashboard", str(store), "--port", port)
    assert_one_line_error(result, 1, f"--port {port}: cannot listen on 127.0.0.1 port {port}")


def test_only_loopback_counts_as_loopback() -> None:
    with listen("127.0.0.1", 0) as local, listen("0.0.0.0", 0) as everywhere:
        assert (is_loopback(local), is_loopback(everywhere)) == (True, False)


def test_the_command_serves_until_sigterm(store: Path) -> None:
    """It prints where it serves on one line, answers there, and stops on SIGTERM."""
    command = [sys.executable, "-m", "dopool", "dashboard", str(store), "--port", "0"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", first)
        assert url is not None, first
        assert first.rstrip().endswith(f"for store {store}, read-only (--allow-control to act)")
        with urllib.request.urlopen(url[0] + "api/overview", timeout=TIMEOUT) as answer:
            document = json.load(answer)
        assert [pool["pending"] for pool in document["pools"]] == [20, 0]
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=TIMEOUT)
    finally:
        server.kill()
        server.wait()
    assert server.returncode == 0, err
    assert out == "dopool dashboard: stopped (SIGTERM)\n"
    assert err == ""
