"""The lesson registry: every lesson declared once, run one way.

A lesson module declares itself with `lesson(...)` around its run function::

    @lesson(2, "dtypes", title="Matmul speed and accuracy per dtype",
            seed="Colab notebook, lesson 2 (dtypes and tensor cores)",
            params={"size": 8192}, quick_params={"size": 2048})
    def run(r: LessonRun) -> None:
        m = r.measure("matmul float16", cudalab.matmul, a, b, flops=2 * n**3)
        r.row(dtype="float16", tflops=m.tflops)
        r.finding(f"float16 runs {x:.1f}x float32", value=x, unit="x", labels=(...))

`run(name, quick=False, **params)` checks the parameters, requires a GPU,
calls the function with a `LessonRun` that collects what it records, and
returns an immutable `LessonResult`. The CLI, the pytest plugin, the
notebooks and the results files all go through it.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import time
import types
from typing import Any, Callable, Mapping

from .. import _core
from ..bench import Measurement, Timer, ceiling_preset, torch_cuda
from ..bench.ceilings import CEILING_PRESET
from .result import Check, Claim, Finding, LessonResult, set_lesson_lookup

__all__ = ["Lesson", "LessonCheckError", "LessonRun", "get", "lesson", "names", "resolve_params",
           "run"]

# Presets per mode: quick runs stay within seconds; full runs publish figures.
QUICK_PRESET = "quick"
FULL_PRESET = "default"


class LessonCheckError(_core.CudalabError):
    """A lesson's correctness check failed: what it computed is wrong, so its
    timings mean nothing."""


@dataclasses.dataclass(frozen=True)
class Lesson:
    """A registered lesson.

    Attributes
    ----------
    number, name, title : int, str, str
    seed : str
        The tutorial section it comes from.
    params : mapping
        The full-mode defaults; every parameter the lesson takes.
    quick_params : mapping
        Overrides of `params` for quick mode (seconds on an H100/H200).
    function : callable
        ``function(r: LessonRun) -> None``.
    plot : callable or None
        ``plot(result, ax)`` draws the lesson's figure.
    torch_twin : callable or None
        ``torch_twin(torch_label)`` -> the label of cudalab's measurement of
        the same work, for PyTorch labels that `versus_torch`'s naming rules
        do not pair (None: no twin).
    check : callable or None
        ``check(params)`` raises ValueError for parameter values the lesson
        cannot run with; called on the parameters of a run before any GPU
        work (or the GPU check).
    """

    number: int
    name: str
    title: str
    seed: str
    params: Mapping[str, Any]
    quick_params: Mapping[str, Any]
    function: Callable[[LessonRun], None]
    plot: Callable[[LessonResult, Any], None] | None = None
    torch_twin: Callable[[str], str | None] | None = None
    check: Callable[[Mapping[str, Any]], Any] | None = None

    def defaults(self, quick: bool) -> dict[str, Any]:
        merged = dict(self.params)
        if quick:
            merged.update(self.quick_params)
        return merged


_REGISTRY: dict[str, Lesson] = {}


def lesson(number: int, name: str, *, title: str, seed: str, params: Mapping[str, Any],
           quick_params: Mapping[str, Any] | None = None,
           torch_twin: Callable[[str], str | None] | None = None,
           check: Callable[[Mapping[str, Any]], Any] | None = None) -> Callable:
    """Register the decorated ``run(r)`` function as lesson `name`.

    `torch_twin` maps a PyTorch measurement's label to cudalab's of the same
    work where the usual naming does not (see `cudalab.lessons.versus`).
    `check(params)` raises ValueError for parameter values the lesson cannot
    run with; `run` calls it before it looks for a GPU.

    The returned function gains a ``.plot`` decorator to register the
    lesson's figure: ``@run.plot`` on ``def plot(result, ax)``.
    """
    quick_params = dict(quick_params or {})
    unknown = set(quick_params) - set(params)
    if unknown:
        raise ValueError(f"lesson {name!r}: quick_params {sorted(unknown)} are not params")

    def register(function: Callable[[LessonRun], None]) -> Callable[[LessonRun], None]:
        if name in _REGISTRY or any(x.number == number for x in _REGISTRY.values()):
            raise ValueError(f"lesson {number} {name!r} is registered twice")
        _REGISTRY[name] = Lesson(number, name, title, seed, types.MappingProxyType(dict(params)),
                                 types.MappingProxyType(quick_params), function,
                                 torch_twin=torch_twin, check=check)

        def set_plot(drawer: Callable[[LessonResult, Any], None]) -> Callable:
            _REGISTRY[name] = dataclasses.replace(_REGISTRY[name], plot=drawer)
            return drawer

        function.plot = set_plot  # type: ignore[attr-defined]
        return function

    return register


def names() -> list[str]:
    """The registered lessons' names, in lesson order."""
    return [x.name for x in sorted(_REGISTRY.values(), key=lambda x: x.number)]


def get(name: str) -> Lesson:
    """The `Lesson` called `name`; ValueError listing the valid names otherwise."""
    return _lookup(name, "lessons.get")


def _lookup(name: str, func: str) -> Lesson:
    """`get`, its errors naming `func` (the public function the caller called)."""
    if not isinstance(name, str):
        raise TypeError(f"{func}() argument 'name': expected a str, got {type(name).__name__}")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"{func}() argument 'name': no lesson {name!r}; "
                         f"the lessons are {', '.join(names())}") from None


# LessonResult.plot looks lessons up through this registry (see set_lesson_lookup).
set_lesson_lookup(get)


def check_params(x: Lesson, params: Mapping[str, Any], func: str = "lessons.run") -> None:
    """ValueError naming the parameters `x` does not take, and listing those it does."""
    unknown = [k for k in params if k not in x.params]
    if unknown:
        raise ValueError(f"{func}(): lesson {x.name!r} has no parameter "
                         f"{', '.join(map(repr, unknown))}; its parameters are "
                         f"{', '.join(x.params) or 'none'}")


def resolve_params(x: Lesson, params: Mapping[str, Any], quick: bool,
                   func: str = "lessons.run") -> dict[str, Any]:
    """resolve_params(x, params, quick, func='lessons.run') -> dict

    The parameters lesson `x` runs with: its defaults for `quick` updated by
    `params`, every name checked (`check_params`) and every value by the
    lesson's own check. Needs no GPU: `run` and the CLI call it first.

    Raises
    ------
    ValueError
        A parameter the lesson does not take, or a value it cannot run with.
    """
    check_params(x, params, func)
    merged = x.defaults(bool(quick))
    merged.update(params)
    if x.check is not None:
        try:
            x.check(types.MappingProxyType(merged))
        except (TypeError, ValueError) as exc:  # the message names the function called
            raise type(exc)(f"{func}(): {exc}") from None
    return merged


class LessonRun:
    """What a lesson's function records into: the collector behind `LessonResult`.

    Attributes
    ----------
    params : mapping
        The parameters of this run (read-only).
    quick : bool
    timer : cudalab.bench.Timer
        The timer of this mode's preset; `measure` uses it.
    """

    def __init__(self, x: Lesson, params: Mapping[str, Any], quick: bool) -> None:
        self.lesson = x
        self.params = types.MappingProxyType(dict(params))
        self.quick = quick
        self.timer = Timer(QUICK_PRESET if quick else FULL_PRESET)
        self.measurements: dict[str, Measurement] = {}
        self.rows: list[dict[str, Any]] = []
        self.findings: list[Finding] = []
        self.claims: list[Claim] = []
        self.checks: list[Check] = []

    def add(self, m: Measurement, label: str | None = None) -> Measurement:
        """Record a Measurement made elsewhere (host clock, a second timer) under `label`."""
        label = m.label if label is None else label
        if label in self.measurements:
            raise ValueError(f"lesson {self.lesson.name!r}: measurement {label!r} recorded twice")
        self.measurements[label] = m
        return m

    def measure(self, label: str, fn: Callable[..., Any], *args: Any, **options: Any) -> Measurement:
        """Time ``fn(*args)`` with this run's timer and record it under `label`.

        `options` are `Timer.measure`'s (flops, bytes, ceiling, description,
        metadata); the Measurement's label is `label`.
        """
        return self.add(self.timer.measure(fn, *args, label=label, **options), label)

    def row(self, **fields: Any) -> None:
        """Append one row of the lesson's table (JSON-able values)."""
        self.rows.append(fields)

    def finding(self, text: str, value: float | None = None, unit: str | None = None,
                labels: tuple[str, ...] = ()) -> None:
        """Record a finding; `labels` must name recorded measurements."""
        missing = [k for k in labels if k not in self.measurements]
        if missing:
            raise ValueError(f"lesson {self.lesson.name!r}: finding rests on unknown "
                             f"measurements {missing}")
        self.findings.append(Finding(text, None if value is None else float(value), unit,
                                     tuple(labels)))

    def claim(self, claim: str, *, tutorial: float | None, measured: float | None,
              unit: str | None, held: bool, why: str) -> None:
        """Record a tutorial claim, the value measured here, and whether it held."""
        self.claims.append(Claim(claim, tutorial, None if measured is None else float(measured),
                                 unit, bool(held), why))

    def check(self, what: str, max_error: float, tolerance: float) -> None:
        """Record a correctness check; raises `LessonCheckError` when it fails."""
        max_error = float(max_error)
        passed = math.isfinite(max_error) and max_error <= tolerance
        self.checks.append(Check(what, max_error, float(tolerance), passed))
        if not passed:
            raise LessonCheckError(f"lesson {self.lesson.name!r}: check failed: {what}: "
                                   f"max error {max_error:.3g} > tolerance {tolerance:.3g}")

    @staticmethod
    def torch() -> Any:
        """PyTorch when it is installed and sees a CUDA device, else None."""
        return torch_cuda()


def _device_and_env() -> tuple[dict[str, Any], dict[str, Any]]:
    from ..bench.results import machine_info

    info = machine_info()
    index = _core.current_device()
    devices = info.pop("devices")
    device = next((d for d in devices if d.get("index") == index), {})
    return dict(device), info


def run(name: str, quick: bool = False, **params: Any) -> LessonResult:
    """Run lesson `name` on the current device and return its `LessonResult`.

    Parameters
    ----------
    name : str
        One of `names()`.
    quick : bool
        Start from the lesson's quick parameters (seconds, for tests and smoke
        runs) instead of the full ones.
    **params
        Overrides of the lesson's parameters; unknown names raise ValueError
        listing the valid ones.

    Raises
    ------
    ValueError
        Unknown lesson or parameter, or a value the lesson cannot run with
        (checked before the GPU).
    NoDeviceError
        No GPU (after the arguments are checked).
    LessonCheckError
        What the lesson computed is wrong.
    """
    # Every argument first (the name, each parameter's name and value), then the
    # device: without a GPU the error names lessons.run().
    x = _lookup(name, "lessons.run")
    merged = resolve_params(x, params, quick)
    _core._parse_device(None, "lessons.run")  # NoDeviceError naming the caller
    recorder = LessonRun(x, merged, bool(quick))
    start = time.perf_counter()
    # Quick lessons measure a ceiling they are first to need with the quick
    # preset; a full run measures (or re-measures) it sustained.
    with ceiling_preset("quick" if quick else CEILING_PRESET):
        x.function(recorder)
    wall = time.perf_counter() - start
    device, env = _device_and_env()
    return LessonResult(
        lesson=x.name, number=x.number, title=x.title, seed=x.seed, params=dict(merged),
        quick=bool(quick), device=device, env=env, measurements=dict(recorder.measurements),
        rows=tuple(recorder.rows), findings=tuple(recorder.findings),
        claims=tuple(recorder.claims), checks=tuple(recorder.checks), wall_seconds=wall,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
