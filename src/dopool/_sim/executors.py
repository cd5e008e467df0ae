"""Where a sweep's runs and the chaos harness's seeds run: here, or as tasks on Ray.

``--executor local`` (the default) keeps each command's own way: a sweep's process pool
(:mod:`dopool._sim.sweep`), the chaos harness's (:mod:`dopool._chaos.harness`).
``--executor ray`` runs each run as a Ray task (:func:`ray_map`) on a local Ray (one
already running on this machine, else one started for the command and stopped after
it); ``--executor ray=ADDRESS`` on the cluster at ``ADDRESS`` (``host:port``, ``auto``,
``ray://host:port``). Each run is the same function of the same arguments as in a
local worker process, so the results are the same, and they come back in the order
of the calls whatever order the tasks end in.

What travels with the job. On a local Ray the workers share this machine's files: each
task runs in the directory dopool runs in, with this process's ``sys.path``. With an
address, or ``$RAY_ADDRESS`` (what ``ray.init()`` would read), nothing is assumed
shared: dopool's own package goes as the job's ``py_modules`` (so the cluster runs
this dopool, whatever it has installed; it needs dopool's dependencies), and a caller
that reads files (a sweep whose scenario names an app or a replay file) sends the
directory dopool runs in as its ``working_dir`` (what ``.gitignore`` lists, and
``.git``, ``.venv`` and ``__pycache__``, stay behind), where each task then runs. The
``DOPOOL_*`` environment variables (``DOPOOL_SIM_BACKEND``) go with every task.

Ray is the optional ``ray`` extra, imported only here and only when used. Its errors
are mapped to ours at this boundary::

    ConfigurationError
    ├── RayUnavailableError  --executor ray, and Ray cannot be imported
    └── RayConnectError      no Ray could be started, or none answers at the address
    DopoolError
    └── RayRunError          a run's task ended without an answer (its worker died)

A run's own error (a :class:`~dopool._sim.sweep.SweepRunError`) comes back whole, as
from a local worker process. Ctrl-C cancels every task not yet done: a running one
stops between two steps of its clock and removes its temporary store, or is killed
after :data:`CANCEL_GRACE` seconds.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from dopool._errors import ConfigurationError, DopoolError
from dopool._sim.interrupt import worker_task

R = TypeVar("R")

EXTRA = "ray"  # pyproject's optional dependency group
KINDS = ("local", "ray")
CONNECT_TIMEOUT = 10.0  # seconds to reach an address before Ray's own retries (minutes)
CANCEL_GRACE = 10.0  # seconds a cancelled run has to stop before its worker is killed
#: What a shipped ``working_dir`` leaves behind besides what ``.gitignore`` lists.
EXCLUDES = (".git", ".venv", "__pycache__")
ENV_PREFIX = "DOPOOL_"  # the environment variables that go with every task
PACKAGE = Path(__file__).resolve().parent.parent  # dopool's own, as py_modules ships it


class RayUnavailableError(ConfigurationError):
    """``--executor ray``, and Ray is not installed.

    Attributes:
        missing: the module that could not be imported.
    """

    def __init__(self, missing: str) -> None:
        self.missing = missing
        super().__init__(
            f"--executor ray needs Ray ({missing} is missing), dopool's '{EXTRA}' extra "
            f"(pip install '.[{EXTRA}]' in dopool's source tree)"
        )


class RayConnectError(ConfigurationError):
    """No Ray could be started, or none answers at the address given.

    Attributes:
        address: the address (``--executor ray=ADDRESS`` or ``$RAY_ADDRESS``); None for
            a local Ray.
        problem: what went wrong.
    """

    def __init__(self, address: str | None, problem: str) -> None:
        self.address = address
        self.problem = problem
        where = f"cannot join the Ray cluster at {address!r}" if address else "no local Ray"
        super().__init__(f"--executor ray: {where}: {problem}")


class RayRunError(DopoolError):
    """A run's Ray task ended without an answer of its own: its worker or node died, or
    its runtime environment could not be set up.

    Attributes:
        run: which run (``"--sweep instances=2, seed 3"``, ``"seed 17"``).
        problem: what Ray said.
    """

    def __init__(self, run: str, problem: str) -> None:
        self.run = run
        self.problem = problem
        super().__init__(f"{run}: its Ray task failed: {problem}")


@dataclass(frozen=True, slots=True)
class Executor:
    """Where runs go: ``local`` (this machine's worker processes) or ``ray`` (Ray tasks:
    a local Ray, or the cluster at ``address``)."""

    kind: str = "local"
    address: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigurationError(f"an executor is one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.address is not None and (self.kind != "ray" or not self.address.strip()):
            raise ConfigurationError(f"{self.kind!r} takes no address: {self.address!r}")

    @classmethod
    def parse(cls, text: str) -> Executor:
        """``local``, ``ray`` or ``ray=ADDRESS``, as ``--executor`` takes it.

        Raises:
            ConfigurationError: anything else.
        """
        kind, sep, address = text.partition("=")
        kind = kind.strip()
        if kind not in KINDS or (sep and (kind != "ray" or not address.strip())):
            raise ConfigurationError(f"expected local, ray or ray=ADDRESS, got {text!r}")
        return cls(kind, address.strip() if sep else None)

    @property
    def ray(self) -> bool:
        return self.kind == "ray"

    @property
    def target(self) -> str | None:
        """The address ``ray.init`` is given or reads (``$RAY_ADDRESS``); None: local."""
        if not self.ray:
            return None
        return self.address or os.environ.get("RAY_ADDRESS") or None

    @property
    def ships(self) -> bool:
        """Whether a job's code and files travel to the cluster (an address is known)."""
        return self.target is not None

    def __str__(self) -> str:
        return self.kind if self.address is None else f"{self.kind}={self.address}"


LOCAL = Executor()


def check_available(executor: Executor) -> None:
    """Raise :class:`RayUnavailableError` now, before any run, if Ray is asked and missing."""
    if executor.ray:
        _import_ray()


def ray_map(
    function: Callable[..., R],
    calls: Sequence[tuple[Any, ...]],
    *,
    executor: Executor,
    describe: Callable[[int], str],
    limit: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    directory: bool = False,
) -> Iterator[R]:
    """``function(*call)`` for each call as a Ray task; the results in the order of
    ``calls``, each as soon as it and every one before it are done.

    ``function`` must be a module's, found by name where the tasks run.
    At most ``limit`` tasks are out at once (None: every one; Ray schedules them on
    the cluster's CPUs, one each). ``progress(done, total)`` is called as each ends,
    in any order. ``describe(position)`` names a call in an error. With ``directory``
    and an address, the directory dopool runs in travels as the job's ``working_dir``.
    If this process has called ``ray.init`` already, that Ray is used, whatever the
    executor's address, and what travels is what its job was given.

    Raises:
        RayUnavailableError, RayConnectError: Ray is missing, or cannot be reached.
        RayRunError: a task ended without an answer.
        Exception: what a call raised, as it raised it.
    """
    total = len(calls)
    environment = _runtime_env(executor, directory)
    with _session(executor, environment) as (ray, joined):
        options: dict[str, Any] = {"num_cpus": 1}
        if joined and "env_vars" in environment:  # the caller's job: only these per task
            options["runtime_env"] = {"env_vars": environment["env_vars"]}
        task = ray.remote(_call).options(**options)
        name = f"{function.__module__}:{function.__qualname__}"
        place = (
            _Place(None, ())
            if executor.ships
            else _Place(os.getcwd(), tuple(entry for entry in sys.path if entry))
        )
        pending: dict[Any, int] = {}  # ObjectRef -> position in calls
        finished: dict[int, R] = {}
        upcoming = iter(range(total))
        following = 0  # the next position to yield
        done = 0
        if progress is not None:
            progress(0, total)
        try:
            while True:
                while limit is None or len(pending) < limit:
                    position = next(upcoming, None)
                    if position is None:
                        break
                    pending[task.remote(place, name, calls[position])] = position
                if not pending:
                    break
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    position = pending.pop(ref)
                    finished[position] = _answer(ray, ref, describe(position))
                    done += 1
                    if progress is not None:
                        progress(done, total)
                while following in finished:
                    yield finished.pop(following)
                    following += 1
        except BaseException:  # Ctrl-C, a run's error, or the caller gone: nothing left out
            _cancel(ray, list(pending))
            raise


class _Place(NamedTuple):
    """Where a task runs its call: the directory, and ``sys.path`` entries to add (a
    local Ray's, which shares this machine's files); none for a shipped job."""

    directory: str | None
    path: tuple[str, ...]


def _call(place: _Place, name: str, call: tuple[Any, ...]) -> Any:
    """One call of the function ``name`` (``module:qualname``), in a Ray worker: where
    this process would make it (the function is found by name once ``sys.path`` is as
    here: a task's arguments are unpickled before it starts), and Ray's cancel (SIGINT,
    in the task's thread) taken as a local worker takes Ctrl-C."""
    if place.directory is not None:
        os.chdir(place.directory)  # a Ray worker serves one job: this one
    sys.path.extend(entry for entry in place.path if entry not in sys.path)
    module, _, qualname = name.partition(":")
    function: Any = importlib.import_module(module)
    for part in qualname.split("."):
        function = getattr(function, part)
    with worker_task() as interrupt:
        result = function(*call)
    interrupt.check()
    return result


def _import_ray() -> Any:
    try:
        import ray  # noqa: PLC0415 - the optional extra, only for --executor ray
    except ImportError as exc:
        raise RayUnavailableError(exc.name or "ray") from None
    return ray


@contextmanager
def _session(executor: Executor, environment: dict[str, Any]) -> Iterator[tuple[Any, bool]]:
    """Ray, connected, and whether it was the caller's: if ``ray.init`` was called
    already, its job is joined and left as it is (what travels is then the caller's
    ``runtime_env``; Ray takes local paths at a job's start only); else a job is started
    with ``environment`` for this ``with`` and shut down after it."""
    ray = _import_ray()
    if ray.is_initialized():
        yield ray, True
        return
    address = executor.target
    if address is not None:
        _probe(address)
    try:
        ray.init(address=address, runtime_env=environment or None, logging_level=logging.WARNING)
    except Exception as exc:
        raise RayConnectError(address, _problem(exc)) from exc
    try:
        yield ray, False
    finally:
        ray.shutdown()


def _probe(address: str) -> None:
    """Within :data:`CONNECT_TIMEOUT`, a connection to ``host:port`` that answers as a
    gRPC server does (Ray's head does): ``ray.init`` retries an address nothing
    answers at, or something else does, for minutes, deaf to Ctrl-C for most of them."""
    host, colon, port = address.split("://", 1)[-1].rpartition(":")
    if not colon or not port.isdigit():
        return  # auto, local, a name Ray resolves itself
    host = host.strip("[]")  # an IPv6 address, [::1]:6379
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT) as link:
            if os.environ.get("RAY_USE_TLS", "0") in ("0", ""):
                _answers_http2(link)
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError):
            reason = f"no answer in {CONNECT_TIMEOUT:g} s"
        raise RayConnectError(address, reason) from None


#: HTTP/2's client preface and an empty SETTINGS frame: gRPC's transport answers them
#: with a SETTINGS frame of its own, before anything else.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS = 4  # the frame type, the fourth byte of a frame's header


def _answers_http2(link: socket.socket) -> None:
    """Raise ``OSError`` unless ``link``'s server answers the preface with SETTINGS."""
    link.sendall(HTTP2_PREFACE)
    header = b""
    while len(header) < 9:
        chunk = link.recv(9 - len(header))
        if not chunk:
            raise OSError("it closed the connection: not a Ray cluster's address")
        header += chunk
    if header[3] != SETTINGS:
        raise OSError("it does not answer as gRPC does: not a Ray cluster's address")


def _problem(exc: BaseException) -> str:
    """What Ray said, on one line: the error's message and its cause's last line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    cause = exc.__cause__
    if cause is not None:
        lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
        if lines:
            text += f" ({lines[-1]})"
    return text


def _runtime_env(executor: Executor, directory: bool) -> dict[str, Any]:
    """What travels with each task: the ``DOPOOL_*`` variables; with an address, dopool's
    package, and with ``directory`` the directory dopool runs in."""
    environment: dict[str, Any] = {}
    variables = {name: value for name, value in os.environ.items() if name.startswith(ENV_PREFIX)}
    if variables:
        environment["env_vars"] = variables
    if executor.ships:
        environment["py_modules"] = [os.fspath(PACKAGE)]
        if directory:
            environment["working_dir"] = os.getcwd()
            environment["excludes"] = list(EXCLUDES)
    return environment


def _answer(ray: Any, ref: Any, run: str) -> Any:
    """A task's result; what its call raised, raised again; Ray's own failure mapped. A
    task stopped by Ctrl-C (a terminal's reaches a local Ray's workers too, maybe before
    this process) or cancelled is ``KeyboardInterrupt`` here, as in a local worker."""
    try:
        return ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        raise KeyboardInterrupt from None
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
            raise cause from exc
        raise RayRunError(run, _problem(exc)) from exc
    except ray.exceptions.RayError as exc:
        raise RayRunError(run, _problem(exc)) from exc


def _cancel(ray: Any, refs: list[Any]) -> None:
    """Cancel each task: one not started never starts, a running one is told as by
    Ctrl-C, and killed if it has not ended within :data:`CANCEL_GRACE` seconds."""
    if not refs:
        return
    for ref in refs:
        with contextlib.suppress(Exception):  # ended meanwhile, or its worker gone
            ray.cancel(ref)
    _, running = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE)
    for ref in running:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
