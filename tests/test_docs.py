"""The documentation is the contract: no citation of an outside specification, no dead link.

docs/guarantees.md and docs/api.md are what the code, the tests and the other pages cite,
so a citation of a specification outside the repository points at text its reader
cannot see. And a cited section must exist: every relative link in docs/*.md and
README.md must name an existing file and, after ``#``, an existing heading of it.
Where a page and the code list the same things (docs/simulate.md's figures and flags),
they agree.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from dopool._cli.simulate import simulate
from dopool._sim.figures import DESCRIPTIONS, E2E_DESCRIPTIONS, POOL_DESCRIPTIONS

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
