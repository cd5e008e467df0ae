"""The documentation is the contract: no citation of an outside specification, no dead link.

docs/guarantees.md and docs/api.md are what the code, the tests and the other pages cite,
so a citation of a specification outside the repository points at text its reader
cannot see. And a cited section must exist: every relative link in docs/*.md and
README.md must name an existing file and, after ``#``, an existing heading of it.
Where a page and the code list the same things (docs/simulate.md's figures and flags),
they agree.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import re
import shlex
import typing
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import dopool
import dopool.ray
import dopool.testing
from dopool import Runtime
from dopool._cli import cli
from dopool._cli.simulate import simulate
from dopool._engine.options import PoolOptions
from dopool._errors import MAX_DELAY
from dopool._sim.figures import DESCRIPTIONS, E2E_DESCRIPTIONS, POOL_DESCRIPTIONS
from dopool._store.layout import limits
from dopool._store.layout.limits import FORMAT_VERSION
from dopool._types import EventKind, EventState, InstanceState
from dopool.chaos import FaultPlan

ROOT = Path(__file__).parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
# [text](target): the text may hold backticks and span lines, the target has no spaces.
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)\)")
HTML_ANCHOR = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def outside_code(text: str) -> str:
    """``text`` without its fenced code blocks (a ``# comment`` in one is no heading)."""
    kept: list[str] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation but '-' and '_' dropped,
    spaces to '-'."""
    kept = "".join(ch for ch in heading.lower() if ch.isalnum() or ch in "-_ ")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link into ``page`` may name (repeated headings get -1, -2, ...)."""
    text = outside_code(page.read_text(encoding="utf-8"))
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for line in text.splitlines():
        match = HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    """The targets of ``page``'s links, outside code blocks."""
    return LINK.findall(outside_code(page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("where", ["src", "docs", "README.md"])
def test_no_outside_specification_is_cited(where: str) -> None:
    path = ROOT / where
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    files = [f for f in files if "__pycache__" not in f.parts and f.suffix != ".pyc"]
    assert files
    hits = [
        f"{f.relative_to(ROOT)}:{number}"
        for f in files
        for number, line in enumerate(f.read_bytes().splitlines(), 1)
        if b"SPEC" in line
    ]
    assert not hits, "cite docs/guarantees.md or docs/api.md instead: " + ", ".join(hits)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken: list[str] = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target}: no file {file_part}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_guarantees_are_numbered_and_link_to_their_sections() -> None:
    page = ROOT / "docs" / "guarantees.md"
    text = page.read_text(encoding="utf-8")
    listed = re.findall(r"^(\d)\. \[[^\]]+\]\(#([^)]+)\)", text, re.MULTILINE)
    assert listed == [
        ("1", "no-loss"),
        ("2", "at-least-once-execution"),
        ("3", "order-and-priority"),
        ("4", "counters"),
        ("5", "determinism-under-the-simulated-clock"),
        ("6", "an-instances-own-storage"),
    ]
    assert {anchor for _, anchor in listed} <= anchors(page)


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Order and priority", "order-and-priority"),
        ("`runtime.close()`", "runtimeclose"),
        ("`runtime.kill(pool_name, index) -> None`", "runtimekillpool_name-index---none"),
        ("SimulatedClock(start=0.0)", "simulatedclockstart00"),
        ("Follow-up events (the outbox)", "follow-up-events-the-outbox"),
    ],
)
def test_slug_follows_github(heading: str, expected: str) -> None:
    assert slug(heading) == expected


# -- docs/simulate.md and the code -----------------------------------------------------------
def section(page: Path, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of that level."""
    text = page.read_text(encoding="utf-8")
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def figures_table() -> str:
    """The "Figures" table of docs/simulate.md as the code's figures make it."""
    rows = [f"| `{name}` | {meaning} |" for name, meaning in DESCRIPTIONS.items()]
    rows += [
        f"| `e2e.{name}` | with follow-ups: {text} |" for name, text in E2E_DESCRIPTIONS.items()
    ]
    rows += [
        f"| `<pool>.{name}` | with several pools: {text} |"
        for name, text in POOL_DESCRIPTIONS.items()
    ]
    return "\n".join(["| figure | meaning |", "| --- | --- |", *rows])


def test_the_figures_table_is_the_codes() -> None:
    documented = section(ROOT / "docs" / "simulate.md", "Figures")
    table = "\n".join(line for line in documented.splitlines() if line.startswith("|"))
    assert table == figures_table(), "paste this into docs/simulate.md:\n" + figures_table()


def test_every_simulate_flag_is_documented() -> None:
    text = (ROOT / "docs" / "simulate.md").read_text(encoding="utf-8")
    missing = [
        option.opts[0]
        for option in simulate.params
        if isinstance(option, click.Option)
        and not any(re.search(rf"`{re.escape(name)}[ `]", text) for name in option.opts)
    ]
    assert missing == []


# -- the Python examples run -----------------------------------------------------------------
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# Blocks that cannot run as they stand, by their first line: they name a deployment's paths
# (a Ray deployment's driver runs in tests/ray/test_ray_pools.py instead),
# or import the example module before them (tests/handles/test_testing_plugin.py runs that
# test file under pytest, beside its module).
NOT_RUN = {
    'import dopool\n\nconnection = dopool.connect("/srv/app/queue")',
    "# deploy.py: a driver on any node",  # a Ray cluster's: tests/ray/ runs it
    "# test_payments.py: ",
}
# "print(x)  # text": what the example says it prints.
PRINTS = re.compile(r"^(\s*)print\((.*)\)  # (.*)$", re.MULTILINE)


def python_examples() -> list[tuple[str, str]]:
    """(page:line, code) of every ```python block of README.md and docs/*.md."""
    found: list[tuple[str, str]] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in PYTHON_BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            if not any(match.group(1).startswith(start) for start in NOT_RUN):
                found.append((f"{page.name}:{line}", match.group(1)))
    return found


def checking_prints(code: str) -> str:
    """``code`` whose commented prints assert that they print what the comment says."""
    return PRINTS.sub(lambda match: f"{match[1]}__printed({match[3]!r}, {match[2]})", code)


def printed(expected: str, *values: object) -> None:
    shown = " ".join(str(value) for value in values)
    assert shown == expected, f"the example prints {shown!r}, its comment says {expected!r}"


@pytest.mark.parametrize(("where", "code"), python_examples(), ids=lambda value: value[:30])
def test_a_python_example_runs_as_written(
    where: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example runs in an empty directory; one that enqueues through
    ``dopool.connect("./data")`` finds the pool a worker would have defined there, and
    the trace reader finds a run's trace: its p99 is the report's."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "example", "__printed": printed}
    if 'connect("./data")' in code:
        with Runtime("./data") as owner:
            owner.define("emails", execute=lambda ctx: None, concurrency=4)
    if "trace.jsonl" in code:
        args = ["simulate", "-q", "--events", "200", "--json", "run.json"]
        assert CliRunner().invoke(cli, [*args, "--trace", "trace.jsonl"]).exit_code == 0
    if "partition_key.encode" in code:  # the routing formula, beside the router
        namespace.update(partition_key="customer-9", concurrency=7)
    exec(compile(checking_prints(code), where, "exec"), namespace)
    if "trace.jsonl" in code:
        report = json.loads(Path("run.json").read_text(encoding="utf-8"))
        assert round(namespace["p99"], 6) == report["latency"]["p99"]  # type: ignore[call-overload]
    if "partition_key.encode" in code:
        with Runtime.simulated() as rt:
            pool = rt.define("p", execute=lambda ctx: None, concurrency=7)
            assert pool.enqueue(1, partition_key="customer-9").instance_index == namespace["index"]


def test_the_examples_are_found() -> None:
    pages = {where.split(":")[0] for where, _ in python_examples()}
    assert {"README.md", "api.md", "guarantees.md", "simulate.md"} <= pages


# -- docs/api.md's signatures and records are the code's --------------------------------------
API = ROOT / "docs" / "api.md"
CALL = re.compile(r"^([\w.]+)\((.*)\)(?:\s*->\s*(.+))?$")
POOL_METHODS = [
    *("enqueue", "enqueue_many", "pause", "resume", "drain", "event", "cancel", "join"),
    *("status", "dead_letters", "redrive", "purge_dead_letters"),
    *("schedule", "schedules", "unschedule"),
    *("enqueue_async", "enqueue_many_async", "event_async", "cancel_async", "status_async"),
]
TESTING_CALLS = [
    "run_handler",
    *("assert_pending", "assert_succeeded", "assert_dead_letters", "assert_paused"),
]
# How docs/api.md names what a heading documents.
DOCUMENTED_CALLS: dict[str, object] = {
    "Runtime": Runtime,
    "Runtime.simulated": Runtime.simulated,
    "runtime.define": Runtime.define,
    "runtime.subscribe": Runtime.subscribe,
    "runtime.kill": Runtime.kill,
    "runtime.close": Runtime.close,
    "dopool.connect": dopool.connect,
    "connection.pool": dopool.Connection.pool,
    "dopool.ray.deploy": dopool.ray.deploy,
    "dopool.ray.connect": dopool.ray.connect,
    "ctx.enqueue": dopool.EventContext.enqueue,
    "ctx.sleep": dopool.EventContext.sleep,
    "RealClock": dopool.RealClock,
    "SimulatedClock": dopool.SimulatedClock,
    **{name: getattr(dopool.WorkerPool, name) for name in POOL_METHODS},
    **{name: getattr(dopool.testing, name) for name in TESTING_CALLS},
}


def written(value: object) -> str:
    """A default as docs/api.md writes it."""
    if isinstance(value, str):
        return json.dumps(value)
    return "math.inf" if value == math.inf else repr(value)


def parameters(code: object) -> list[str]:
    """``code``'s parameters as docs/api.md writes them: ``name``, ``name=default``,
    ``*``, ``**options``; a ``**options: Unpack[SomeDict]`` also as its keys, keyword-only
    (``name=?``: the default is the code's to say)."""
    shown: list[str] = []
    for parameter in inspect.signature(code).parameters.values():  # type: ignore[arg-type]
        if parameter.name == "self":
            continue
        if parameter.kind is parameter.KEYWORD_ONLY and "*" not in shown:
            shown.append("*")
        if parameter.kind is parameter.VAR_KEYWORD:
            shown.append(f"**{parameter.name}")
        elif parameter.default is parameter.empty:
            shown.append(parameter.name)
        else:
            shown.append(f"{parameter.name}={written(parameter.default)}")
    return shown


def unpacked(code: object) -> list[str]:
    """``parameters(code)`` with ``**options: Unpack[SomeDict]`` spelt out as its keys."""
    shown = [part for part in parameters(code) if not part.startswith("**")]
    hints = typing.get_type_hints(code, include_extras=True)
    for parameter in inspect.signature(code).parameters.values():  # type: ignore[arg-type]
        if parameter.kind is parameter.VAR_KEYWORD:
            (keys,) = typing.get_args(hints[parameter.name])
            if "*" not in shown:
                shown.append("*")
            shown += [f"{key}=?" for key in typing.get_type_hints(keys)]
    return shown


SCHEDULE_CALLS = ("schedule(", "schedules(", "unschedule(")


def documented_calls() -> list[tuple[str, str]]:
    """(where, call) for every call in a heading of docs/api.md, the SimulatedClock and
    ProducerPool tables' method column and the recurring schedules' signatures."""
    found: list[tuple[str, str]] = []
    text = outside_code(API.read_text(encoding="utf-8"))
    section = ""
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading:
            section = heading.group(1)
            parts = re.findall(r"`([^`]+)`", section) or [section]
            found += [(section, part) for part in parts if CALL.match(part)]
        elif section.startswith(("SimulatedClock", "ProducerPool")) and line.startswith("| `"):
            owner = section.split("(")[0]
            for part in re.findall(r"`([^`]+\))(?: -> ([^`]+))?`", line.split(" | ")[0]):
                found.append((owner, f"{owner}.{part[0]}" + (f" -> {part[1]}" if part[1] else "")))
        elif section == "Recurring schedules" and line.startswith("`"):
            parts = re.findall(r"`([^`]+)`", line)
            found += [(section, part) for part in parts if part.startswith(SCHEDULE_CALLS)]
    return found


def target(where: str, name: str) -> object:
    if where in ("SimulatedClock", "ProducerPool"):
        return getattr(getattr(dopool, where), name.rpartition(".")[2])
    return DOCUMENTED_CALLS[name]


def test_api_md_documents_the_calls_it_should() -> None:
    names = {CALL.match(call).group(1) for _, call in documented_calls()}  # type: ignore[union-attr]
    assert set(DOCUMENTED_CALLS) <= names
    assert {"SimulatedClock.step", "SimulatedClock.run_until_idle", "ProducerPool.cancel"} <= names


@pytest.mark.parametrize(("where", "call"), documented_calls(), ids=lambda value: value[:40])
def test_a_documented_signature_is_the_codes(where: str, call: str) -> None:
    match = CALL.match(call.replace("\\|", "|"))
    assert match is not None
    name, arguments, returns = match.groups()
    code = target(where, name)
    documented = [part.strip() for part in arguments.split(",") if part.strip()]
    if any(part.startswith("**") for part in documented) or not any(
        part.startswith("**") for part in parameters(code)
    ):
        assert documented == parameters(code), f"the code has {name}({', '.join(parameters(code))})"
    else:
        spelt = unpacked(code)
        same = len(documented) == len(spelt) and all(
            mine == theirs or (theirs.endswith("=?") and mine.split("=")[0] == theirs[:-2])
            for mine, theirs in zip(documented, spelt, strict=True)
        )
        assert same, f"the code has {name}({', '.join(spelt)})"
    if returns is not None:
        annotation = inspect.signature(code).return_annotation  # type: ignore[arg-type]
        assert returns.strip() == annotation, f"{name} returns {annotation}"


def record_section(name: str) -> str:
    """The text of docs/api.md under ``### name`` (or ``## name``), up to the next heading."""
    text = API.read_text(encoding="utf-8")
    start = re.split(rf"\n###? {name}\n", text, maxsplit=1)[1]
    return re.split(r"\n#{1,6} ", start, maxsplit=1)[0]


@pytest.mark.parametrize(
    "record",
    [
        dopool.EnqueueResult,
        dopool.PoolStatus,
        dopool.InstanceStatus,
        dopool.DeadLetter,
        dopool.ScheduleInfo,
        dopool.EventInfo,
        dopool.EmptyInfo,
        dopool.PoolEvent,
        dopool.EventContext,
        dopool.testing.HandlerRun,
        dopool.testing.FollowUp,
    ],
    ids=lambda record: record.__name__,
)
def test_a_records_fields_are_documented(record: type) -> None:
    """A record's section names every field (in its table of fields' first column, or else
    its first paragraph), and names nothing the record lacks."""
    text = record_section(record.__name__)
    if "| field |" in text:
        parts = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| `")]
    else:
        parts = [text.strip().split("\n\n")[0]]
    named = {name for part in parts for name in re.findall(r"`(\w+)[`:]", part)}
    named -= {"None", "on_empty"}  # words of the prose
    fields = {field.name for field in dataclasses.fields(record) if not field.name.startswith("_")}
    assert fields - named == set(), "fields not documented"
    assert {name for name in named if not hasattr(record, name)} == set(), "no such fields"


@pytest.mark.parametrize(
    ("heading", "values"),
    [
        ("PoolEvent", typing.get_args(EventKind)),
        ("InstanceStatus", typing.get_args(InstanceState)),
        ("EventInfo", typing.get_args(EventState)),
    ],
)
def test_every_kind_and_state_is_documented(heading: str, values: tuple[str, ...]) -> None:
    text = record_section(heading)
    if heading == "PoolEvent":
        documented = [
            name
            for line in text.splitlines()
            if line.startswith("| `")
            for name in re.findall(r"`(\w+)`", line.split(" | ")[0])
        ]
    else:
        state = next(line for line in text.splitlines() if line.startswith("| `state` |"))
        documented = re.findall(r'`"(\w+)"`', state)
    assert sorted(documented) == sorted(values)


def exception_tree() -> dict[str, tuple[str | None, set[str]]]:
    """docs/api.md's tree of exceptions: each one's parent and the attributes it lists."""
    block = API.read_text(encoding="utf-8").split("\n## Exceptions\n", 1)[1].split("```\n", 2)[1]
    tree: dict[str, tuple[str | None, set[str]]] = {}
    path: list[str] = []
    name = ""
    for line in block.splitlines():
        match = re.match(r"^([│├└─ ]*)(\w+)", line)
        if match and match.group(2)[0].isupper() and not match.group(1).endswith("  "):
            depth = len(match.group(1)) // 4
            name = match.group(2)
            path[depth:] = [name]
            tree[name] = (path[depth - 1] if depth else None, set())
        tree[name][1].update(re.findall(r"(?<![\w.])\.(\w+)", line))
    return tree


def test_the_exception_tree_is_the_codes() -> None:
    tree = exception_tree()
    exceptions = {
        name
        for name in dopool.__all__
        if isinstance(getattr(dopool, name), type) and issubclass(getattr(dopool, name), Exception)
    }
    assert set(tree) == exceptions
    for name, (parent, attributes) in tree.items():
        error = getattr(dopool, name)
        assert error.__bases__[0].__name__ == (parent or "Exception"), name
        inherited, above = set(attributes), parent
        while above is not None:
            above, more = tree[above]
            inherited |= more
        kept = set(re.findall(r"\bself\.([a-z]\w*) = ", inspect.getsource(error)))
        assert kept <= inherited, f"{name} also keeps {kept - inherited}"
        for attribute in attributes:
            assert any(
                re.search(rf"(self\.|^    ){attribute}\b.* = ", inspect.getsource(cls), re.M)
                for cls in error.__mro__[:-3]
            ), f"{name} has no .{attribute}"


# -- the command lines the pages show are the CLI's -------------------------------------------
COMMAND = re.compile(r"(?:^|\$ |`|python -m )dopool ([a-z-]+)(.*?)(?=`|$|  #)", re.MULTILINE)


def flags_shown() -> dict[str, set[str]]:
    """The flags each ``dopool COMMAND`` line of the pages gives, in code or in text."""
    shown: dict[str, set[str]] = {}
    for page in PAGES:
        # a synopsis's continuation lines ("    [--grace SECONDS]") belong to its command
        text = re.sub(r"\n\s+(\[--)", r" \1", page.read_text(encoding="utf-8"))
        for match in COMMAND.finditer(text):
            found = re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", match.group(2))
            shown.setdefault(match.group(1), set()).update(found)
    return shown


def flags_taken(command: str) -> set[str]:
    assert isinstance(cli, click.Group)
    options = [param for param in cli.commands[command].params if isinstance(param, click.Option)]
    return {name for option in options for name in (*option.opts, *option.secondary_opts)} | {
        "-h",
        "--help",
    }


def test_every_flag_the_pages_show_exists() -> None:
    assert isinstance(cli, click.Group)
    shown = {command: flags for command, flags in flags_shown().items() if command in cli.commands}
    assert {"worker", "pause", "drain", "schedules", "dead-letters", "chaos"} <= set(shown)
    unknown = {command: flags - flags_taken(command) for command, flags in shown.items()}
    assert {command: flags for command, flags in unknown.items() if flags} == {}


@pytest.mark.parametrize(
    "command",
    [
        "worker",
        "pause",
        "resume",
        "drain",
        "schedules",
        "status",
        "check",
        "chaos",
        "storage",
        "dashboard",
    ],
)
def test_every_flag_of_a_store_command_is_shown(command: str) -> None:
    """A command's flags all appear on some ``dopool COMMAND`` line (simulate's and
    dead-letters' have tables of their own)."""
    assert flags_taken(command) - {"-h", "--help"} <= flags_shown()[command]


# -- docs/simulate.md's reports are what the runs print ---------------------------------------
BUILT_IN: tuple[str, ...] = ("steady", "burst", "hot-partition", "poison", "crash-storm")
BUILT_IN += ("maintenance", "daily-cycle")
HEADLINES = (
    "events ",
    "refused ",
    "throughput ",
    "latency ",
    "enqueue wait ",
    "faults ",
    "activations ",
)


def report_samples() -> list[tuple[str, list[str], list[str]]]:
    """(where, simulate's arguments, the sample's headline lines) of each report in
    docs/simulate.md that shows one run: after its ``$ dopool simulate`` line, or under a
    built-in scenario's heading."""
    page = ROOT / "docs" / "simulate.md"
    samples: list[tuple[str, list[str], list[str]]] = []
    heading = ""
    text = page.read_text(encoding="utf-8")
    for match in re.finditer(r"^### ([^\n]*)$|^```text\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        if match.group(1) is not None:
            heading = match.group(1).split(":")[0]
            continue
        lines = match.group(2).splitlines()
        if lines[0].startswith("$ dopool simulate"):
            args = shlex.split(lines[0].split("  #")[0])[3:]
        elif heading in BUILT_IN:
            args = ["--scenario", heading]
        else:
            continue
        if "--sweep" in args or any(line.startswith("$ ") for line in lines[1:]):
            continue
        if "--plot" in args:
            del args[args.index("--plot") : args.index("--plot") + 2]
        shown = [line for line in lines if line.startswith(HEADLINES)]
        if shown:
            where = f"simulate.md:{text.count(chr(10), 0, match.start()) + 1}"
            samples.append((where, args, shown))
    return samples


def test_the_reports_are_found() -> None:
    scenarios = {args[1] for _, args, _ in report_samples() if args[0] == "--scenario"}
    assert scenarios >= {*BUILT_IN, "examples/pipeline.toml", "examples/phases.toml"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "args", "shown"), report_samples(), ids=lambda value: str(value)[:40]
)
def test_a_reports_headlines_are_what_the_run_prints(
    where: str, args: list[str], shown: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report in the page shows the numbers its run prints today (its headline lines:
    events, refused, throughput, latency, enqueue wait and faults)."""
    monkeypatch.chdir(ROOT)  # examples/ is named from the repository's root
    done = CliRunner(env={"COLUMNS": "140"}).invoke(cli, ["simulate", *args, "-q"])
    printed = " ".join(done.output.split())  # a long line may wrap
    stale = [line for line in shown if " ".join(line.split()) not in printed]
    assert stale == [], f"{where}: the run prints other numbers"


def test_the_define_block_is_the_pool_options() -> None:
    """api.md's ``WorkerPool.define(...)`` block lists PoolOptions' fields and defaults."""
    text = API.read_text(encoding="utf-8")
    block = text.split("```\nWorkerPool.define(\n", 1)[1].split(")\n```", 1)[0]
    documented = [part.strip() for part in block.split(",") if part.strip()]
    fields = [
        field.name
        if field.default is dataclasses.MISSING
        else f"{field.name}={written(field.default)}"
        for field in dataclasses.fields(PoolOptions)
        if field.init  # (``is_async`` is read off ``execute``)
    ]
    assert documented == ["name", "*", *fields, "runtime=None"]


def toml_examples() -> list[tuple[str, str]]:
    """(page:line, text) of every ```toml block of the pages."""
    found: list[tuple[str, str]] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"^```toml\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            found.append((f"{page.name}:{text.count(chr(10), 0, match.start()) + 2}", match[1]))
    return found


@pytest.mark.parametrize(("where", "scenario"), toml_examples(), ids=lambda value: value[:24])
def test_a_scenario_example_is_a_valid_scenario(where: str, scenario: str, tmp_path: Path) -> None:
    """Each TOML example, alone in a file, is a scenario dopool reads (every field checked)."""
    path = tmp_path / "example.toml"
    path.write_text(scenario, encoding="utf-8")
    done = CliRunner().invoke(cli, ["simulate", "--scenario", str(path), "--print-scenario"])
    assert done.exit_code == 0, f"{where}: {done.output}"


def test_store_format_md_describes_the_format_the_code_writes() -> None:
    text = (ROOT / "docs" / "store-format.md").read_text(encoding="utf-8")
    assert f"This page describes **format {FORMAT_VERSION}**" in text


@pytest.mark.parametrize(
    ("pattern", "code"),
    [
        (r"`dopool\.chaos\.FaultPlan\(([^`]*)\)`", FaultPlan),
        (r"```\nRetryPolicy\(([^`]*)\)\n```", dopool.RetryPolicy),
    ],
    ids=["FaultPlan", "RetryPolicy"],
)
def test_a_config_objects_documented_fields_are_its_own(pattern: str, code: type) -> None:
    """The keyword-only config objects' signatures as api.md writes them out."""
    match = re.search(pattern, API.read_text(encoding="utf-8"))
    assert match is not None
    documented = [part.strip() for part in match[1].split(",")]
    assert documented == parameters(code)


def test_the_limits_the_pages_give_are_the_codes() -> None:
    guarantees = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    api = API.read_text(encoding="utf-8")
    assert f"| event size | ≤ {limits.MAX_EVENT_BYTES // 1024} KiB after" in guarantees
    assert f"| partition key | ≤ {limits.MAX_PARTITION_KEY_BYTES // 1024} KiB of" in guarantees
    assert f"| dedup key | 1 byte to {limits.MAX_DEDUP_KEY_BYTES // 1024} KiB of" in guarantees
    concurrency = f"| concurrency | 1\N{EN DASH}{limits.MAX_CONCURRENCY:,} instances per pool"
    assert concurrency in guarantees
    assert limits.POOL_NAME.pattern == r"[A-Za-z0-9_.-]{1,64}"
    assert "| pool name | 1\N{EN DASH}64 characters of `[A-Za-z0-9_.-]` |" in guarantees
    assert (limits.PRIORITY_MIN, limits.PRIORITY_MAX) == (-(2**31), 2**31 - 1)
    assert "an `int` in `[-2**31, 2**31 - 1]`" in api
    assert f"finite and at least {limits.MIN_EVERY}." in api
    assert f"is 365 days, `{int(MAX_DELAY):_}` seconds" in api


def test_store_format_md_lists_every_key_the_layout_defines() -> None:
    """The Keys table's prefixes and instance tags are the single bytes keys.py names."""
    table = section(ROOT / "docs" / "store-format.md", "Keys")
    rows = [line.split(" | ")[0][3:-1] for line in table.splitlines() if line.startswith("| `")]
    tags = {row.split("\\0 ")[1][0] for row in rows if row.startswith("I ")}
    documented = {row[0] for row in rows} | tags
    source = (ROOT / "src" / "dopool" / "_store" / "layout" / "keys.py").read_text(encoding="utf-8")
    defined = set(re.findall(r'b"([A-Za-z])"', source.split("_DIGESTED")[0]))
    assert documented == defined


def test_several_workers_say_what_fencing_does_not_order() -> None:
    """Fencing refuses a hung worker's outcome, not its handler's side effects, which may
    come after later events of the partition ran elsewhere (test_lease_processes.py shows
    the hung handlers returning after the other worker's reruns); the page must not let
    "order" read as covering them."""
    page = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    workers = page.split("\n### Several workers\n", 1)[1].split("\n### ", 1)[0]
    assert "order holds for committed starts, not for handler bodies" in workers
    assert "Its outcome and its follow-ups are refused" in workers
    promises = section(ROOT / "docs" / "guarantees.md", "What dopool does not promise")
    assert "**An order of side effects across a hang.**" in promises


def test_the_worker_defaults_the_pages_give_are_its_own() -> None:
    assert isinstance(cli, click.Group)
    defaults = {
        option.opts[0]: option.default
        for option in cli.commands["worker"].params
        if isinstance(option, click.Option)
    }
    page = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    assert defaults["--grace"] == 30.0
    assert "**Running handlers get `--grace` seconds** (30 by default)" in page
    assert defaults["--lease-ttl"] == 10.0
    assert "`--lease-ttl` seconds (10 by default)" in page
    assert defaults["--log-level"] == "info"
    assert "at `--log-level` (`info` by default)" in page
    assert defaults["--durability"] == "sync"
    runtime = inspect.signature(Runtime).parameters
    assert defaults["--poll-interval"] == runtime["poll_interval"].default == 1.0
