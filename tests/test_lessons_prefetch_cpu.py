"""CPU tier: lesson 13 `prefetch`'s workers, GPU monitor and nvidia-smi parts without a GPU.

The pure functions behind its findings (the worker counts' pace, the phases'
mean utilization, what counts as CSV), its parameter checks, the loader with
worker threads through the logging stand-in of tests/test_lessons_d_cpu.py,
and the monitor and nvidia-smi steps with stand-ins for GpuMonitor and the
nvidia-smi process.
"""

from __future__ import annotations

import subprocess
import threading
import types

import numpy as np
import pytest
import test_lessons_d_cpu as standin

from cudalab import lessons
from cudalab.lessons import prefetch
from cudalab.monitor import NvmlUnavailableError
from cudalab.prefetch import WORKER_THREAD_NAME

# What nvidia-smi prints without options (the table the tutorial's -lms loop repeats).
SMI_TABLE = """\
Thu Aug 14 12:58:27 2025
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|=========================================+========================+======================|
|   0  Tesla T4                       Off |   00000000:00:04.0 Off |                    0 |
| N/A   53C    P8             10W /   70W |       0MiB /  15360MiB |      0%      Default |
+-----------------------------------------+------------------------+----------------------+
"""
SMI_CSV = """\
timestamp, utilization.gpu [%], memory.used [MiB], power.draw [W]
2025/08/14 12:58:27.123, 0 %, 0 MiB, 10.52 W
"""


def _params(**over):
    return {**lessons.get("prefetch").defaults(True), **over}


def test_registered_with_workers_and_monitor_params():
    x = lessons.get("prefetch")
    assert x.params["workers"] == (1, 2, 4) and x.params["monitor_s"] > 0
    assert 0 < x.defaults(True)["monitor_s"] <= x.params["monitor_s"]
    prefetch.check_params(x.defaults(False))
    prefetch.check_params(x.defaults(True))
    prefetch.check_params(_params(monitor_s=0, workers=[3]))
    assert len(set(prefetch.ROW_KEYS)) == len(prefetch.ROW_KEYS)


@pytest.mark.parametrize("over,match", [
    ({"workers": ()}, "workers must be a non-empty sequence of ints >= 1"),
    ({"workers": (0, 2)}, "workers must be a non-empty sequence of ints >= 1"),
    ({"workers": 2}, "workers must be a non-empty sequence"),
    ({"workers": (2, 2)}, r"workers must be distinct counts from 1 to 32, got \(2, 2\)"),
    ({"workers": (1, 33)}, "workers must be distinct counts from 1 to 32"),
    ({"monitor_s": -1}, "monitor_s must be a number of seconds from 0 to 10"),
    ({"monitor_s": 11.0}, r"monitor_s must be .* \(0: no GPU monitor\), got 11.0"),
    ({"monitor_s": True}, "monitor_s must be"),
    ({"monitor_s": "1"}, "monitor_s must be"),
])
def test_bad_params(over, match):
    with pytest.raises(ValueError, match=r"^lesson 'prefetch': " + match):
        prefetch.check_params(_params(**over))


def test_worker_labels_and_the_gpu_bound_threshold():
    assert prefetch.worker_label(1) == "prefetch, 1 worker"
    assert prefetch.worker_label(4) == "prefetch, 4 workers"
    assert prefetch.gpu_bound(prefetch.GPU_BOUND * 2e-3, 2e-3)
    assert not prefetch.gpu_bound(prefetch.GPU_BOUND * 2e-3 * 1.01, 2e-3)


def test_workers_text_says_from_which_count_the_loop_is_gpu_bound():
    text = prefetch.workers_text({0: 2.5e-3, 1: 2.4e-3, 2: 2.35e-3, 4: 2.33e-3}, 2.3e-3, 2.4e-3)
    assert text.startswith("Prefetching with host worker threads, per batch: 0 workers 2.50 ms "
                           "(1.00x), 1 worker 2.40 ms (1.04x), 2 workers 2.35 ms (1.06x)")
    assert "preparing one batch takes 2.40 ms on one thread and the GPU step 2.30 ms" in text
    assert "From 1 worker the loop runs at the GPU step's pace (within 5%)" in text
    assert "without workers it was 1.09x the step" in text
    text = prefetch.workers_text({0: 5e-3, 2: 3e-3, 4: 2e-3}, 2e-3, 5e-3)
    assert "From 4 workers the loop" in text


def test_workers_text_host_bound_and_already_gpu_bound():
    host = prefetch.workers_text({0: 5e-3, 1: 5e-3, 2: 4e-3}, 2e-3, 5e-3)
    assert "Host-bound with any count: the best, 2 workers, is 2.00x the GPU step" in host
    done = prefetch.workers_text({0: 2e-3, 1: 2e-3}, 2e-3, 1e-3)
    assert "Prefetching alone already keeps pace with the GPU" in done


def test_phase_means_leave_out_the_settling_samples_and_missing_values():
    samples = [(0.0, 90), (0.1, 80), (0.3, 40), (0.5, 50), (0.6, None), (0.7, 95), (1.2, 100),
               (1.3, 99)]
    phases = {"sync": (0.0, 0.6), "prefetch": (0.6, 1.3), "empty": (1.3, 1.4)}
    got = prefetch.phase_means(samples, phases, settle=0.25)
    assert got == {"sync": 45.0, "prefetch": 99.5, "empty": None}
    assert prefetch.phase_means([], {"a": (0, 1)}) == {"a": None}


def test_csv_rows_tell_the_text_table_from_csv():
    assert prefetch.csv_rows(SMI_TABLE) == (0, 9)
    assert prefetch.csv_rows(SMI_CSV) == (2, 0)
    assert prefetch.csv_rows(SMI_CSV + "a,b,c\n\n") == (2, 1)
    assert prefetch.csv_rows("") == (0, 0)
    assert prefetch.CSV_LOG_COMMAND.startswith("nvidia-smi --query-gpu=")
    assert "--format=csv -lms 100 > gpu_log.csv" in prefetch.CSV_LOG_COMMAND


# ---- the loader with worker threads --------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_host_loader_with_workers_prefetches_every_batch_in_order(workers):
    src = standin._source(batches=9)
    api = standin._FakeApi()
    made = []
    loader = prefetch.HostLoader(src, pinned=True, workers=workers,
                                 pinned_empty=lambda s: made.append(np.empty(s, np.float32))
                                 or made[-1])
    assert prefetch._consumed(prefetch.Prefetcher(loader, api), src.batches, src) == (9, 0)
    assert len(made) == prefetch.SLOTS + workers  # one more buffer per worker, no more
    assert [e for e in api.log if e[0] == "upload"] == [("upload", True)] * 9
    assert not [t for t in threading.enumerate() if t.name.startswith(WORKER_THREAD_NAME)]


# ---- the GPU monitor and nvidia-smi with stand-ins -----------------------------------------


class _Run:
    """The parts of a LessonRun the monitor and nvidia-smi steps use."""

    def __init__(self, **params):
        self.params = params
        self.findings, self.claims = [], []

    def finding(self, text, value=None, unit=None, labels=()):
        self.findings.append(text)

    def claim(self, claim, **fields):
        self.claims.append((claim, fields))


class _Monitor:
    """A GpuMonitor whose utilization is 30% before `switch` seconds and 90% after."""

    switch = 0.0

    def __init__(self, interval_ms):
        self.samples = []

    def __enter__(self):
        self._t0 = prefetch.time.perf_counter()
        return self

    def __exit__(self, *exc):
        t, end = 0.0, prefetch.time.perf_counter() - self._t0
        while t <= end:
            util = 30 if t < _Monitor.switch else 90
            self.samples.append(types.SimpleNamespace(t_s=t, gpu_utilization_pct=util))
            t += 0.01
        return False

    def to_csv(self, path=None):
        assert path is None  # the lesson leaves no file behind
        return "t_s,gpu_utilization_pct\n" + "".join(f"{x.t_s},{x.gpu_utilization_pct}\n"
                                                      for x in self.samples)


def test_monitor_reports_each_phase_and_writes_the_csv(monkeypatch):
    monkeypatch.setattr(prefetch, "GpuMonitor", _Monitor)
    monkeypatch.setattr(prefetch, "UTIL_SETTLE_S", 0.0)
    calls = []
    epochs = {k: (lambda k=k: calls.append(k)) for k in ("a", "b")}
    _Monitor.switch = 0.05
    r = _Run(monitor_s=0.05)
    util = prefetch._monitor(r, epochs, ("a", "b"))
    assert set(calls) == {"a", "b"} and calls.index("b") > calls.index("a")
    assert util["b"] == 90 and 30 <= util["a"] <= 90
    [text] = r.findings
    assert text.startswith("GPU utilization (mean of NVML samples every 50 ms, 0.05 s per loop")
    assert "a: " in text and "b: 90%" in text and "GpuMonitor.to_csv() gives the" in text
    assert prefetch.CSV_LOG_COMMAND in text


def test_monitor_without_nvml_says_so_and_does_not_fail(monkeypatch):
    def missing(interval_ms):
        raise NvmlUnavailableError("NVML is unavailable: no pynvml")

    monkeypatch.setattr(prefetch, "GpuMonitor", missing)
    r = _Run(monitor_s=1.0)
    assert prefetch._monitor(r, {"a": pytest.fail}, ("a",)) == {}
    assert r.findings[0].startswith("GPU utilization not measured: NVML is unavailable")
    r = _Run(monitor_s=0)
    assert prefetch._monitor(r, {"a": pytest.fail}, ("a",)) == {}
    assert r.findings[0].startswith("GPU utilization not measured (monitor_s=0)")


def test_nvidia_smi_claim_from_its_output(monkeypatch):
    runs = []

    def fake_run(args, **kwargs):
        runs.append(args)
        assert kwargs["timeout"] == prefetch.NVIDIA_SMI_TIMEOUT_S
        out = SMI_CSV if any(a.startswith("--query-gpu") for a in args) else SMI_TABLE
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(prefetch.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(prefetch.subprocess, "run", fake_run)
    r = _Run()
    prefetch._nvidia_smi(r)
    assert runs == [["/usr/bin/nvidia-smi"], ["/usr/bin/nvidia-smi",
                                              f"--query-gpu={prefetch.CSV_QUERY}",
                                              "--format=csv"]]
    [(claim, fields)] = r.claims
    assert claim == "`nvidia-smi -lms 100 > gpu_log.csv` logs the GPU's usage as CSV"
    assert fields["held"] is False and fields["measured"] == 9
    assert "9 of 9 lines are not rows of a CSV table" in fields["why"]
    assert "gives 2 CSV line(s) (0 not)" in fields["why"]


def test_nvidia_smi_missing_or_failing_is_a_finding(monkeypatch):
    monkeypatch.setattr(prefetch.shutil, "which", lambda name: None)
    r = _Run()
    prefetch._nvidia_smi(r)
    assert not r.claims and r.findings[0].startswith("nvidia-smi is not on the PATH")

    def failing(args, **kwargs):
        raise subprocess.TimeoutExpired(args, kwargs["timeout"])

    monkeypatch.setattr(prefetch.shutil, "which", lambda name: "/bin/nvidia-smi")
    monkeypatch.setattr(prefetch.subprocess, "run", failing)
    r = _Run()
    prefetch._nvidia_smi(r)
    assert not r.claims and r.findings[0].startswith("nvidia-smi failed")
