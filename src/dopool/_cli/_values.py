"""Values as text, no recursion: tagged JSON (``_json_text``, ``_write_json``), a cut repr."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

from dopool._cli._errors import CliError

JSON_TAGS = (
    '(bytes as {"$base64": ...}, NaN and infinities as {"$float": "NaN"}, a map with '
    'non-str keys as {"$map": [[key, value], ...]}: see docs/simulate.md)'
)


class _Raw(str):
    """Text a walk below emits as it is, rather than a value to convert."""


def _json_text(document: Any) -> str:
    """``document`` as indented JSON that any strict parser accepts.

    What JSON cannot hold is tagged (docs/simulate.md, "JSON output"): bytes as
    ``{"$base64": ...}``, a non-finite float as ``{"$float": "NaN"}`` (or
    ``"Infinity"``, ``"-Infinity"``), a map with any key that is not a str as
    ``{"$map": [[key, value], ...]}``, anything else as ``{"$repr": repr(value)}``.
    It walks without recursion: an event may nest a thousand levels deep.
    """
    out: list[str] = []
    stack: list[Any] = [(document, 0)]
    while stack:
        top = stack.pop()
        if isinstance(top, _Raw):
            out.append(top)
            continue
        value, depth = top
        value = _json_tagged(value)
        pairs: list[tuple[str, Any]]
        if isinstance(value, dict) and value:
            opening, closing = "{", "}"
            pairs = [(json.dumps(key) + ": ", item) for key, item in value.items()]
        elif isinstance(value, list) and value:
            opening, closing = "[", "]"
            pairs = [("", item) for item in value]
        else:
            out.append(json.dumps(value, allow_nan=False))  # a scalar, [] or {}
            continue
        out.append(opening)
        inner = "\n" + "  " * (depth + 1)
        stack.append(_Raw("\n" + "  " * depth + closing))
        for position in reversed(range(len(pairs))):
            prefix, item = pairs[position]
            stack.append((item, depth + 1))
            stack.append(_Raw(("," if position else "") + inner + prefix))
    return "".join(out)


def _write_json(path: Path, document: Any) -> None:
    """Write ``document`` as :func:`_json_text` to ``path``; a failure is a one-line error."""
    try:
        path.write_text(_json_text(document) + "\n", encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


def _json_tagged(value: Any) -> Any:
    """``value`` itself if JSON holds it, else its tagged stand-in (one level deep)."""
    if value is None or isinstance(value, bool | int | str | list):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value):
            return value
        return {"$map": [[key, item] for key, item in value.items()]}
    return {"$repr": repr(value)}


def _short(event: Any, width: int = 60) -> str:
    """``repr(event)``, cut to ``width`` characters.

    It writes lists and maps itself, without recursion (an event may nest deeper
    than ``repr`` can go), and stops once it has enough.
    """
    parts: list[str] = []
    size = 0
    stack: list[Any] = [event]
    while stack and size <= width:
        value = stack.pop()
        if isinstance(value, _Raw):
            text: str = value
        elif isinstance(value, list | tuple | dict) and value:
            items = list(value.items()) if isinstance(value, dict) else list(value)
            closing = "}" if isinstance(value, dict) else "]" if isinstance(value, list) else ")"
            if isinstance(value, tuple) and len(value) == 1:
                closing = ",)"
            stack.append(_Raw(closing))
            for position in reversed(range(len(items))):
                if isinstance(value, dict):
                    key, item = items[position]
                    stack.extend((item, _Raw(": "), key))
                else:
                    stack.append(items[position])
                if position:
                    stack.append(_Raw(", "))
            text = "{" if isinstance(value, dict) else "[" if isinstance(value, list) else "("
        else:
            text = repr(value)
        parts.append(text)
        size += len(text)
    text = "".join(parts)
    return text if len(text) <= width and not stack else text[: width - 1] + "…"
