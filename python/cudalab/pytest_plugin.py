"""cudalab's pytest plugin: the ``gpu`` marker and the ``gpu_benchmark`` fixture.

Installing cudalab registers this module with pytest (the ``pytest11`` entry
point named ``cudalab``), so any test suite in that environment gets:

* ``@pytest.mark.gpu``: the test is skipped when ``cudalab.is_available()``
  is False. With ``CUDALAB_REQUIRE_GPU=1`` in the environment the skip
  becomes a failure, so a GPU run can never pass by silently skipping.
* ``gpu_benchmark(fn, *args, **options)``: times ``fn(*args)`` with
  `cudalab.bench.measure` and returns the result of fn's first call, so the
  test can check it; the `Measurement` is recorded (``label`` defaults to the
  test's node id; other options go to `measure`). ``gpu_benchmark.measurements``
  lists this test's measurements. Without a GPU the test is skipped (or fails
  under ``CUDALAB_REQUIRE_GPU=1``), as with the marker.
* ``gpu_benchmark.lesson(name, quick=True, **params)``: runs a lesson
  (`cudalab.lessons.run`) and records each of its measurements, labelled
  ``"<lesson>: <label>"`` as in a lessons results file, so the comparison
  below catches a lesson's regressions; returns the `LessonResult`.
* ``--gpu-benchmark-preset NAME``: the timing preset of the fixture
  (``quick``, ``default`` or ``sustained``; default ``default``); a call's own
  ``preset=`` option wins.
* ``--gpu-benchmark-json PATH``: write every measurement of the session with
  machine info (`cudalab.bench.results` describes the layout). The directory
  must exist.
* ``--gpu-benchmark-compare PATH``: compare each measurement with the one of
  the same (label, sub_label, description) in a results file (one written by
  ``--gpu-benchmark-json``, or any other cudalab results file);
  ``--gpu-benchmark-compare-fail 10%`` (or ``0.1``)
  fails every test whose median time grew by more than that. The failure is
  the test's own: it is raised after the test body has run (so the test's
  own checks of the result run first and every benchmark of the test is
  measured), and its message gives the baseline and current medians, the
  change and the threshold. Measurements missing from the baseline are
  listed but never fail.
* A "cudalab gpu_benchmark" section at the end of the terminal report: each
  measurement's median, IQR and rates, and the comparison when one was asked.

Nothing here touches the GPU unless a test uses the marker or the fixture.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from .bench import MEASURE_OPTIONS, PRESETS, WORK_OPTIONS, Measurement, Timer, get_preset
from .bench.baseline import (
    Comparison,
    Record,
    compare,
    format_threshold,
    load_baseline,
    parse_threshold,
    summary_lines,
)
from .bench.results import machine_info, write_results

__all__ = [
    "BenchmarkSession",
    "GpuBenchmark",
    "benchmark_session",
    "gpu_available",
    "gpu_required",
    "session_from_options",
]

GPU_MARKER = (
    "gpu: needs a CUDA device (skipped without one; CUDALAB_REQUIRE_GPU=1 makes the skip a failure)"
)


# ---- the gpu marker ----------------------------------------------------------------------


def gpu_available() -> bool:
    """``cudalab.is_available()``, treating any error as "no GPU"."""
    try:
        from . import _core

        return bool(_core.is_available())
    except Exception:  # is_available() must never raise; treat it as "no GPU"
        return False


def gpu_required() -> bool:
    """True when ``CUDALAB_REQUIRE_GPU=1``: a GPU test must not be skipped."""
    return os.environ.get("CUDALAB_REQUIRE_GPU", "").strip() == "1"


def _skip_or_fail_without_gpu(nodeid: str) -> None:
    """Skip the running test without a GPU, or fail it under CUDALAB_REQUIRE_GPU=1."""
    if gpu_available():
        return
    if gpu_required():
        pytest.fail(
            "CUDALAB_REQUIRE_GPU=1 but cudalab.is_available() is False: "
            f"GPU test {nodeid} cannot run (no CUDA device or driver visible "
            "to cudalab); refusing to skip it",
            pytrace=False,
        )
    pytest.skip("needs a CUDA device (cudalab.is_available() is False)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or, with CUDALAB_REQUIRE_GPU=1, fail) ``gpu`` tests without a GPU.

    Runs before fixture setup, so GPU-only fixtures never run without a GPU.
    """
    item.stash[_REGRESSIONS] = []  # a rerun of the test starts clean
    if item.get_closest_marker("gpu") is not None:
        _skip_or_fail_without_gpu(item.nodeid)


# ---- options and session state -----------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cudalab", "cudalab GPU benchmarks")
    group.addoption(
        "--gpu-benchmark-preset", metavar="NAME", default="default",
        help=f"timing preset of the gpu_benchmark fixture: {', '.join(PRESETS)} "
             "(default: default)",
    )
    group.addoption(
        "--gpu-benchmark-json", metavar="PATH", default=None,
        help="write every gpu_benchmark measurement of the session, with machine info, to PATH",
    )
    group.addoption(
        "--gpu-benchmark-compare", metavar="PATH", default=None,
        help="compare each gpu_benchmark measurement with the same one in PATH "
             "(a cudalab results file, e.g. one written by --gpu-benchmark-json)",
    )
    group.addoption(
        "--gpu-benchmark-compare-fail", metavar="THRESHOLD", default=None,
        help="with --gpu-benchmark-compare: fail a test whose median time grew by more than "
             "THRESHOLD, a percentage ('10%%') or a fraction ('0.1')",
    )


class BenchmarkSession:
    """Measurements of one pytest session, the baseline, and the options.

    Parameters
    ----------
    json_path : Path or None
        Where to write the results file at the end of the session.
    baseline_path : Path or None
        The results file to compare against.
    baseline : dict
        Its measurements by key.
    threshold : float or None
        Allowed relative increase of the median before a test fails.
    preset : str
        The fixture's timing preset.
    """

    def __init__(
        self,
        json_path: Path | None = None,
        baseline_path: Path | None = None,
        baseline: dict | None = None,
        threshold: float | None = None,
        preset: str = "default",
    ) -> None:
        self.json_path = json_path
        self.baseline_path = baseline_path
        self.baseline = baseline
        self.threshold = threshold
        self.preset = preset
        # key -> Record, in the order first recorded; a rerun of a test replaces its entry.
        self._records: dict[tuple, Record] = {}

    @property
    def records(self) -> list[Record]:
        return list(self._records.values())

    def check_key(self, nodeid: str, key: tuple) -> None:
        """Raise ValueError when a test other than `nodeid` already recorded `key`."""
        previous = self._records.get(key)
        if previous is not None and previous.nodeid != nodeid:
            raise ValueError(
                f"gpu_benchmark(): {previous.measurement.title!r} was already recorded by "
                f"{previous.nodeid}; measurements are matched by (label, sub_label, description), "
                "so give each benchmark its own label, sub_label or description"
            )

    def record(self, nodeid: str, measurement: Measurement) -> Record:
        """Keep a measurement of test `nodeid`; compare it when a baseline is loaded.

        Raises
        ------
        ValueError
            Another test already recorded a measurement with the same key:
            measurements are matched by key, so keys must be unique.
        """
        self.check_key(nodeid, measurement.key)
        comparison = None
        if self.baseline is not None:
            comparison = compare(measurement, self.baseline, self.threshold)
        record = Record(nodeid=nodeid, measurement=measurement, comparison=comparison)
        self._records[measurement.key] = record
        return record


_SESSION = pytest.StashKey[BenchmarkSession]()
_REGRESSIONS = pytest.StashKey[list]()


def _output_path(json_path: str | None) -> Path | None:
    """--gpu-benchmark-json as an absolute path whose directory exists."""
    if json_path is None:
        return None
    out = Path(json_path).absolute()  # tests may change the working directory
    if out.is_dir():
        raise pytest.UsageError(f"--gpu-benchmark-json: {json_path} is a directory; give a file path")
    if not out.parent.is_dir():
        raise pytest.UsageError(
            f"--gpu-benchmark-json: the directory of {json_path} ({out.parent}) does not exist; "
            "create it first")
    return out


def session_from_options(
    json_path: str | None, compare_path: str | None, fail: str | None, preset: str = "default"
) -> BenchmarkSession:
    """Check the benchmark options and load the baseline.

    Raises
    ------
    pytest.UsageError
        A bad threshold, a threshold without a baseline, an unknown preset, or
        a baseline or output path that cannot be used; the message names the
        option.
    """
    if preset not in PRESETS:
        raise pytest.UsageError(f"--gpu-benchmark-preset: unknown preset {preset!r} (expected "
                                f"one of {', '.join(PRESETS)})")
    out = _output_path(json_path)
    threshold = None
    if fail is not None:
        if compare_path is None:
            raise pytest.UsageError(
                "--gpu-benchmark-compare-fail needs --gpu-benchmark-compare PATH (the baseline "
                "to compare with)"
            )
        try:
            threshold = parse_threshold(fail, option="--gpu-benchmark-compare-fail")
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    baseline = None
    baseline_path = None
    if compare_path is not None:
        baseline_path = Path(compare_path)
        try:
            baseline = load_baseline(baseline_path)
        except FileNotFoundError:
            raise pytest.UsageError(f"--gpu-benchmark-compare: {compare_path} does not exist") from None
        except (OSError, ValueError) as exc:
            raise pytest.UsageError(f"--gpu-benchmark-compare: {exc}") from None
    return BenchmarkSession(out, baseline_path, baseline, threshold, preset)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", GPU_MARKER)
    config.stash[_SESSION] = session_from_options(
        config.getoption("gpu_benchmark_json", None),
        config.getoption("gpu_benchmark_compare", None),
        config.getoption("gpu_benchmark_compare_fail", None),
        config.getoption("gpu_benchmark_preset", "default"),
    )


def benchmark_session(config: pytest.Config) -> BenchmarkSession:
    """The `BenchmarkSession` of a pytest run (its options, baseline and records)."""
    return config.stash[_SESSION]


# ---- the fixture -------------------------------------------------------------------------


class GpuBenchmark:
    """The ``gpu_benchmark`` fixture: time a callable, record it, return its result.

    Call it as ``gpu_benchmark(fn, *args, **options)``; `options` are those of
    `cudalab.bench.measure` (``preset``, ``flops``, ``bytes``, ``ceiling``,
    ``label``, ``sub_label``, ``description``, ``min_run_time``, ``flush_l2``,
    ...). ``preset`` defaults to the session's ``--gpu-benchmark-preset``;
    ``label`` defaults to the test's node id; a test that benchmarks several
    things gives each its own ``sub_label`` or ``description``.

    ``gpu_benchmark.lesson(name, quick=True, **params)`` runs a lesson and
    records its measurements (see `lesson`).

    Attributes
    ----------
    measurements : list of Measurement
        What this test has recorded, in call order.
    comparisons : list of Comparison
        Their comparisons with the baseline (empty without
        ``--gpu-benchmark-compare``).
    """

    def __init__(self, item: pytest.Item, session: BenchmarkSession) -> None:
        self._item = item
        self._session = session
        self.measurements: list[Measurement] = []
        self.comparisons: list[Comparison] = []

    def __call__(self, fn: Callable[..., Any], *args: Any, **options: Any) -> Any:
        """Time ``fn(*args)`` with `cudalab.bench.measure`; return the result of its first call.

        fn runs many times (warm-up and timed repeats); a function that writes
        into its arguments (``out=``, in place) has done so every time by then.

        Raises
        ------
        TypeError
            An option `measure` does not take.
        ValueError
            The (label, sub_label, description) key is already used by this
            test or another test of the session.
        """
        unknown = sorted(set(options) - set(MEASURE_OPTIONS))
        if unknown:
            raise TypeError(
                f"gpu_benchmark() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
                f"expected options of cudalab.bench.measure: {', '.join(MEASURE_OPTIONS)}"
            )
        preset = options.pop("preset", None) or self._session.preset
        work = {name: options.pop(name) for name in list(options) if name in WORK_OPTIONS}
        if work.get("label") is None:
            work["label"] = self._item.nodeid
        self._check_new((work["label"], work.get("sub_label"), work.get("description")))
        where = _caller()
        timer = Timer(get_preset(preset, "gpu_benchmark"), **options)
        measurement, result = timer.measure_result(fn, *args, **work)
        self._record(measurement, where)
        return result

    def lesson(self, name: str, quick: bool = True, **params: Any) -> Any:
        """lesson(name, quick=True, **params) -> LessonResult

        Run lesson `name` with `cudalab.lessons.run` and record each of its
        measurements as this test's, labelled ``"<lesson>: <label>"``
        (`cudalab.lessons.results.benchmark_label`, the labels of ``cudalab
        run-all --json``, so such a file serves as a baseline). The lesson
        times with its own preset (quick or default), not the session's.

        Raises
        ------
        ValueError
            Unknown lesson or parameter, or a label this session already
            recorded (the same lesson run twice by a test).
        LessonCheckError
            The lesson computed something wrong.
        """
        from . import lessons  # imports every lesson module: only when a test asks

        where = _caller()
        result = lessons.run(name, quick=quick, **params)
        measurements = [m for _, m in lessons.results.labelled_measurements(result)]
        for m in measurements:  # every key checked before any is recorded
            self._check_new(m.key)
        for m in measurements:
            self._record(m, where)
        return result

    def record(self, measurement: Measurement) -> None:
        """Record a Measurement made elsewhere (e.g. by `cudalab.bench.measure`) as this test's.

        It is written, compared and summarised like the fixture's own.
        """
        if not isinstance(measurement, Measurement):
            raise TypeError(
                f"gpu_benchmark.record() argument 'measurement': expected a "
                f"cudalab.bench.Measurement, got {type(measurement).__name__}"
            )
        self._check_new(measurement.key)
        self._record(measurement, _caller())

    def _check_new(self, key: tuple) -> None:
        self._session.check_key(self._item.nodeid, key)
        if any(m.key == key for m in self.measurements):
            raise ValueError(
                f"gpu_benchmark(): this test already measured {key!r}; give each benchmark "
                "of a test its own sub_label or description"
            )

    def _record(self, measurement: Measurement, where: str) -> None:
        record = self._session.record(self._item.nodeid, measurement)
        self.measurements.append(measurement)
        if record.comparison is not None:
            self.comparisons.append(record.comparison)
            if record.comparison.regressed:
                self._item.stash.setdefault(_REGRESSIONS, []).append((where, record.comparison))


def _caller() -> str:
    """'file.py:line' of the test code that called a GpuBenchmark method."""
    frame = sys._getframe(2)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


@pytest.fixture
def gpu_benchmark(request: pytest.FixtureRequest) -> GpuBenchmark:
    """Time a callable on the GPU with cudalab.bench and return its result.

    ``result = gpu_benchmark(fn, *args, **measure_options)``; see
    `cudalab.pytest_plugin.GpuBenchmark`. Skips the test without a GPU (fails
    it under ``CUDALAB_REQUIRE_GPU=1``).
    """
    _skip_or_fail_without_gpu(request.node.nodeid)
    return GpuBenchmark(request.node, benchmark_session(request.config))


@pytest.hookimpl(trylast=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Fail a test whose benchmarks regressed, once its body has run and passed.

    pytest calls this after the test function (trylast); when the body
    raised, its own failure is reported and the regression is still listed
    in the terminal summary.
    """
    regressions = item.stash.get(_REGRESSIONS, None)
    if not regressions:
        return
    session = benchmark_session(item.config)
    lines = [
        f"{where}: cudalab benchmark regression: {comparison.describe()}"
        for where, comparison in regressions
    ]
    lines.append(
        f"(baseline: {session.baseline_path}; --gpu-benchmark-compare-fail "
        f"{format_threshold(session.threshold)})"
    )
    pytest.fail("\n".join(lines), pytrace=False)


# ---- end of session ------------------------------------------------------------------------


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    bench = config.stash.get(_SESSION, None)
    if bench is None or bench.json_path is None or hasattr(config, "workerinput"):
        return
    write_results(bench.json_path, "pytest", [r.row() for r in bench.records],
                  machine=machine_info(config.rootpath),
                  command=" ".join(["pytest", *config.invocation_params.args]),
                  extra={"preset": get_preset(bench.preset).to_dict()})


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    bench = config.stash.get(_SESSION, None)
    if bench is None:
        return
    records = bench.records
    if not records and bench.json_path is None and bench.baseline_path is None:
        return
    terminalreporter.write_sep("=", "cudalab gpu_benchmark")
    if records:
        for line in summary_lines(records):
            terminalreporter.write_line(line)
    else:
        terminalreporter.write_line("no gpu_benchmark measurements in this session")
    if bench.baseline_path is not None:
        regressed = sum(1 for r in records if r.comparison is not None and r.comparison.regressed)
        missing = sum(1 for r in records if r.comparison is not None and r.comparison.missing)
        measured = {r.measurement.key for r in records}
        unmatched = sum(1 for key in bench.baseline if key not in measured)
        rule = (f"fail above +{format_threshold(bench.threshold)}" if bench.threshold is not None
                else "report only")
        terminalreporter.write_line(
            f"compared with {bench.baseline_path} ({rule}): {regressed} regression(s), "
            f"{missing} without a baseline, {unmatched} baseline entr"
            f"{'y' if unmatched == 1 else 'ies'} not measured in this run"
        )
    if bench.json_path is not None:
        terminalreporter.write_line(f"results written to {bench.json_path}")
