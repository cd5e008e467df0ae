"""``--app``: your own code on the simulated runtime, its pools defined with real handlers.

``app = "module:function"`` (or ``"path/to/file.py:function"``, relative to the
directory dopool runs in) names a function that takes the simulated
:class:`~dopool.Runtime` and defines pools on it. The scenario then gives the
load: its arrivals name the pool they enter, and ``payload = "name"`` names a
function of the same module that makes each arriving event from its number and
a seeded ``random.Random``.
"""

from __future__ import annotations

import importlib
import importlib.util
import random
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dopool._errors import ConfigurationError, ScenarioError

#: ``payload(number, rng) -> event``
Payload = Callable[[int, random.Random], Any]


class AppError(ConfigurationError):
    """The app's code failed: importing it, its function, or a payload function raised.

    Attributes:
        app: the ``module:function`` the scenario names.
        problem: what went wrong.
    """

    def __init__(self, app: str, problem: str) -> None:
        self.app = app
        self.problem = problem
        super().__init__(f"app {app!r}: {problem}")


def raised(exc: BaseException) -> str:
    """``"raised ValueError: no image"``: what the app's code raised, whatever it is (any
    BaseException: its sys.exit() or KeyboardInterrupt must not end the run unexplained,
    nor a __str__ that raises)."""
    try:
        text = str(exc)
    except Exception:  # the app's own __str__, whatever it raises
        text = "(its message could not be made)"
    return f"raised {type(exc).__name__}" + (f": {text}" if text else "")


@dataclass(frozen=True, slots=True)
class App:
    """A loaded app: its module and the function that defines its pools."""

    spec: str
    module: ModuleType
    build: Callable[[Any], object]

    def payload(self, name: str) -> Payload:
        """The module's function ``name``, which makes an arriving event.

        Raises:
            ScenarioError: there is no such function.
        """
        function = getattr(self.module, name, None)
        if not callable(function):
            raise ScenarioError("payload", f"names no function of the app's module: {name!r}")
        chosen: Payload = function
        return chosen

    def define_pools(self, runtime: Any) -> None:
        """Call the app's function with ``runtime``; whatever it raises is an :class:`AppError`."""
        try:
            self.build(runtime)
        except BaseException as exc:
            raise AppError(self.spec, raised(exc)) from exc

    def serve_on(
        self,
        runtime: Any,
        created: Path | None = None,
        first: Callable[[Any], object] | None = None,
    ) -> None:
        """Have the app define its pools on ``runtime``, opened for it on a store, as ``dopool
        worker`` and a Ray shard host do: ``first`` called with it before (if given), and at
        least one pool defined. If any of that fails, the runtime is closed, the store
        directory ``created`` (one its opening made) removed, and the error raised.

        Raises:
            AppError: the app's function raised, or defined no pool.
        """
        try:
            if first is not None:
                first(runtime)
            self.define_pools(runtime)
            if not runtime.pools:
                raise AppError(self.spec, "defined no pool on the runtime (call runtime.define)")
        except BaseException:
            runtime.close()
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            raise


def load_app(spec: str) -> App:
    """Import the module ``spec`` names and find its function.

    Raises:
        ScenarioError: ``spec`` is malformed, or names no module, file or function
            (a usage error, field ``app``).
        AppError: importing the module raised.
    """
    target, colon, name = spec.rpartition(":")
    if not colon or not target or not name.isidentifier():
        raise ScenarioError("app", f"must be 'module:function' or 'file.py:function', got {spec!r}")
    if target.endswith(".py") or "/" in target:
        module = _from_file(spec, Path(target))
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name is not None and target.startswith(exc.name):
                raise ScenarioError("app", f"names no importable module: {target!r}") from None
            raise AppError(spec, f"importing it {raised(exc)}") from exc
        except BaseException as exc:
            raise AppError(spec, f"importing it {raised(exc)}") from exc
    build = getattr(module, name, None)
    if not callable(build):
        raise ScenarioError("app", f"{target!r} has no function {name!r}")
    return App(spec, module, build)


def _from_file(spec: str, path: Path) -> ModuleType:
    if not path.is_file():
        raise ScenarioError("app", f"names no file: {str(path)!r}")
    module_name = f"dopool_app_{path.stem}"
    loader = importlib.util.spec_from_file_location(module_name, path)
    if loader is None or loader.loader is None:
        raise ScenarioError("app", f"cannot be imported as Python: {str(path)!r}")
    module = importlib.util.module_from_spec(loader)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up
    try:
        loader.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[module_name]
        raise AppError(spec, f"importing it {raised(exc)}") from exc
    return module
