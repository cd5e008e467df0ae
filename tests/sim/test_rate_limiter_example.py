"""examples/rate-limiter: a token bucket per API key, in the key's own storage, run small
through ``dopool simulate`` and checked against what its kept store holds
(docs/simulate.md, "A rate limiter: an object per API key")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dopool
from cli_support import assert_one_line_error, invoke

SCENARIO = Path(__file__).parents[2] / "examples" / "rate-limiter" / "scenario.toml"
EVENTS = "3000"  # 7.5 virtual seconds at 400 a second: the hottest keys run dry
EPSILON = 1e-9  # float sums of token refills


@dataclass(frozen=True)
class Run:
    """A run's JSON document and its kept store's buckets, by API key."""

    document: dict[str, Any]
    buckets: dict[str, dict[str, Any]]  # every key the run used: its stored bucket
    received: dict[str, int]  # every key the run used: the requests it was sent

    @property
    def rate(self) -> float:
        return float(self.document["scenario"]["app"]["params"]["rate"])

    @property
    def burst(self) -> float:
        return float(self.document["scenario"]["app"]["params"]["burst"])

    def pool(self, name: str) -> dict[str, Any]:
        pools: list[dict[str, Any]] = self.document["pools"]
        (found,) = [pool for pool in pools if pool["name"] == name]
        return found

    def hottest(self, count: int) -> list[str]:
        return sorted(self.received, key=lambda key: -self.received[key])[:count]


def simulate(folder: Path, *flags: str) -> Run:
    """Run the example small with ``flags``, keeping its store and JSON in ``folder``."""
    store, out = folder / "store", folder / "run.json"
    args = ["simulate", "-s", str(SCENARIO), "-q", "--events", EVENTS, *flags]
    done = invoke(*args, "--store", str(store), "--json", str(out))
    assert done.exit_code == 0, done.output
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document["invariants_passed"]
    received = {
        instance["key"]: instance["enqueued"]
        for instance in document["instances"]
        if instance["pool"] == "limiter"
    }
    with dopool.connect(store) as connection:
        limiter = connection.pool("limiter")
        buckets = {key: limiter.storage(partition_key=key).get("bucket") for key in received}
    return Run(document, buckets, received)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return simulate(tmp_path_factory.mktemp("plain"))


def test_every_request_is_allowed_or_denied_once(plain: Run) -> None:
    assert sum(plain.received.values()) == plain.document["events"]["offered"] == int(EVENTS)
    for key, bucket in plain.buckets.items():
        assert bucket.get("allowed", 0) + bucket.get("denied", 0) == plain.received[key], key


def test_upstream_gets_exactly_the_allowed_requests(plain: Run) -> None:
    allowed = sum(bucket.get("allowed", 0) for bucket in plain.buckets.values())
    upstream = plain.pool("upstream")
    assert upstream["succeeded"] == upstream["enqueued"] == allowed
    assert plain.document["events"]["follow_ups"] == allowed
    assert 0 < allowed < int(EVENTS)  # some denied, not all


def test_the_hottest_keys_get_no_more_than_their_tokens_and_no_fewer(plain: Run) -> None:
    span = plain.document["virtual_time"]
    for key in plain.hottest(10):
        bucket = plain.buckets[key]
        allowed, tokens = bucket["allowed"], bucket["tokens"]
        assert allowed <= plain.burst + plain.rate * span, key
        # A bucket starts full and refills at the rate, from the key's first request to
        # its last: the tokens taken and those left cannot be more than it was given.
        given = plain.burst + plain.rate * (bucket["refilled_at"] - bucket["since"])
        assert allowed + tokens <= given + EPSILON, key
        assert 0 <= tokens <= plain.burst, key
    hottest = plain.buckets[plain.hottest(1)[0]]
    assert hottest["denied"] > hottest["allowed"]  # sent far more than the rate ...
    assert hottest["allowed"] >= plain.rate * (hottest["refilled_at"] - hottest["since"])
    # ... it is limited to the rate, but gets all of it: no token of its is wasted.


def test_the_cold_keys_are_not_limited(plain: Run) -> None:
    cold = [key for key, count in plain.received.items() if count <= plain.burst]
    assert len(cold) > len(plain.received) // 2  # most keys send a few requests
    for key in cold:  # a full bucket lets that many through
        assert plain.buckets[key].get("denied", 0) == 0, key
        assert plain.buckets[key]["allowed"] == plain.received[key], key


def test_retries_after_crashes_take_no_token_twice(tmp_path: Path) -> None:
    # A fifth of the attempts crash their instance after the handler returned, before its
    # outcome committed: the bucket it changed and the request it forwarded are lost with
    # it, and the retry decides again from the bucket last committed.
    crashing = simulate(tmp_path, "--set", "faults.crash_after_execute=0.2")
    assert crashing.document["crashes"] > 100
    assert crashing.pool("limiter")["retries"] > 100
    dead = {
        instance["key"]: instance["dead_lettered"]
        for instance in crashing.document["instances"]
        if instance["pool"] == "limiter"
    }
    for key, bucket in crashing.buckets.items():
        decided = bucket.get("allowed", 0) + bucket.get("denied", 0)
        assert decided + dead[key] == crashing.received[key], key  # five crashes: dead
    allowed = sum(bucket.get("allowed", 0) for bucket in crashing.buckets.values())
    upstream = crashing.pool("upstream")
    assert upstream["succeeded"] + upstream["dead_lettered"] == upstream["enqueued"] == allowed


def test_a_higher_rate_forwards_more(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    sweeping = ("--sweep", "app.rate=2,20,1000", "-j", "1", "--json", str(out))
    done = invoke("simulate", "-s", str(SCENARIO), "-q", "--events", EVENTS, *sweeping)
    assert done.exit_code == 0, done.output
    points = json.loads(out.read_text(encoding="utf-8"))["points"]
    assert [point["values"] for point in points] == [
        {"app.rate": 2},
        {"app.rate": 20},
        {"app.rate": 1000},
    ]
    forwarded = [point["figures"]["upstream.succeeded"]["mean"] for point in points]
    assert forwarded[0] < forwarded[1] < forwarded[2]
    assert forwarded[2] == int(EVENTS)  # a rate no key reaches denies nothing


def test_a_rate_of_zero_is_refused_by_the_app() -> None:
    assert_one_line_error(
        invoke("simulate", "-s", str(SCENARIO), "-q", "--events", "10", "--set", "app.rate=0"),
        1,
        "raised ValueError: rate must be above 0 tokens a second, got 0",
    )
