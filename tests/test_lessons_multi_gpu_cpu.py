"""Lessons 21-25 (p2p, allreduce, data_parallel, multi_gpu_inference, pipeline_parallel) and
their helpers without a GPU: registration, parameter checks (made before any GPU work), the
arithmetic behind every finding and claim from given numbers, the workers' JSON protocol and
fixed-count timing, the "needs N GPUs" path, and the allreduce and data_parallel lessons end to
end on synthetic worker results."""

from __future__ import annotations

import json
import math
import types

import pytest

import cudalab
from cudalab import lessons
from cudalab.bench import Measurement
from cudalab.lessons import multi_gpu as M
from cudalab.lessons import allreduce as A
from cudalab.lessons import data_parallel as D
from cudalab.lessons import multi_gpu_inference as I
from cudalab.lessons import p2p as P
from cudalab.lessons import pipeline_parallel as PP
from cudalab.lessons import registry
from cudalab.lessons.result import LessonResult
from _support import fake_measurement, no_gpu_only

NEW = {"p2p": 21, "allreduce": 22, "data_parallel": 23, "multi_gpu_inference": 24,
       "pipeline_parallel": 25}
MODULES = {"p2p": P, "allreduce": A, "data_parallel": D, "multi_gpu_inference": I,
           "pipeline_parallel": PP}


def _params(name, quick=True, **over):
    return {**lessons.get(name).defaults(quick), **over}


# ---- registration ----------------------------------------------------------------------------


@pytest.mark.parametrize("name,number", list(NEW.items()))
def test_registered_after_the_single_gpu_lessons(name, number):
    x = lessons.get(name)
    assert x.number == number and x.plot is not None
    assert x.quick_params and set(x.quick_params) <= set(x.params)
    assert lessons.names().index(name) == number  # numbered after the 21 lessons 0..20
    assert "gpus" in x.params or name == "data_parallel" and "gpu_counts" in x.params


@pytest.mark.parametrize("name", list(NEW))
def test_full_and_quick_params_pass_their_own_checks(name):
    check = MODULES[name].check_params
    check(_params(name, quick=False))
    check(_params(name, quick=True))


def test_quick_modes_are_small():
    a = lessons.get("allreduce").defaults(True)
    assert max(a["sizes"]) <= 64 << 20 and a["repeats"] <= 10
    assert max(lessons.get("allreduce").params["sizes"]) == 4 << 30
    assert min(lessons.get("allreduce").params["sizes"]) == 8
    p = lessons.get("p2p").defaults(True)
    assert len(p["sizes"]) == 2 and p["gpus"] == 2
    d, dfull = lessons.get("data_parallel").defaults(True), lessons.get("data_parallel").params
    assert max(d["batches"]) <= max(dfull["batches"]) / 4 and d["repeats"] < dfull["repeats"]
    assert tuple(dfull["hidden"]) == (4096,) * 4 and tuple(dfull["batches"]) == (8192, 256)
    assert dfull["precision"] == "bf16"
    i = lessons.get("multi_gpu_inference").defaults(True)
    assert i["batch"] <= 32 and i["precision"] == "fp16"
    pp = lessons.get("pipeline_parallel").defaults(True)
    assert len(pp["chunks"]) <= 2 and pp["batch"] <= 4096


def test_data_parallel_sorts_batches_largest_first():
    assert D.check_params(_params("data_parallel", batches=(256, 8192)))[1] == (8192, 256)
    assert D.check_params(_params("data_parallel", batches=512))[1] == (512,)


def test_pipeline_default_mlp_has_equal_layers_for_balanced_stages():
    sizes, chunks = PP.check_params(_params("pipeline_parallel", quick=False))
    assert sizes == (4096,) * 5 + (16,) and chunks == (1, 2, 4, 8, 16)


# ---- parameter checks: errors name the lesson and the parameter -------------------------------


@pytest.mark.parametrize("name,over,match", [
    ("allreduce", {"sizes": (6,)}, "sizes are bytes of float32"),
    ("allreduce", {"sizes": (0,)}, "sizes are bytes of float32"),
    ("allreduce", {"sizes": ()}, "at least one size"),
    ("allreduce", {"gpus": 0}, "gpus must be None"),
    ("allreduce", {"gpus": True}, "gpus must be None"),
    ("allreduce", {"repeats": 3}, "repeats must be >= 5"),
    ("allreduce", {"latency_calls": 0}, "latency_calls must be an int >= 1"),
    ("allreduce", {"budget_s": 0}, "budget_s must be a number > 0"),
    ("allreduce", {"torch": 1}, "torch must be True or False"),
    ("p2p", {"sizes": (4096,)}, "at least 2 different sizes"),
    ("p2p", {"sizes": (4096, 4097)}, "multiples of 4"),
    ("p2p", {"repeats": 2}, "repeats must be an int >= 3"),
    ("p2p", {"gpus": -1}, "gpus must be None"),
    ("data_parallel", {"batches": (0,)}, "batches must be ints >= 1"),
    ("data_parallel", {"batches": (8, 8)}, "batches must be distinct"),
    ("data_parallel", {"precision": "fp16"}, "precision must be one of fp32, tf32, bf16"),
    ("data_parallel", {"gpu_counts": (0,)}, "gpu_counts must be None"),
    ("data_parallel", {"gpu_counts": "2"}, "gpu_counts must be None"),
    ("data_parallel", {"lr": 2.0}, r"lr must be a number in \(0, 1\)"),
    ("data_parallel", {"repeats": 4}, "repeats must be >= 5"),
    ("data_parallel", {"check_rows": 0}, "check_rows must be an int >= 1"),
    ("data_parallel", {"hidden": ()}, "hidden must be a non-empty sequence"),
    ("data_parallel", {"data_parallel": "yes"}, "data_parallel must be True or False"),
    ("multi_gpu_inference", {"batch": 0}, "each batch size must be in 1..256"),
    ("multi_gpu_inference", {"precision": "fp8"}, "unknown precision 'fp8'"),
    ("multi_gpu_inference", {"steps": 0}, "steps must be an int >= 1"),
    ("multi_gpu_inference", {"graph": 1}, "graph must be True or False"),
    ("pipeline_parallel", {"chunks": (0,)}, "chunks must be ints >= 1"),
    ("pipeline_parallel", {"chunks": ()}, "at least one count"),
    ("pipeline_parallel", {"batch": 2, "chunks": (4,)}, "fewer rows than 4 micro-batches"),
    ("pipeline_parallel", {"precision": "fp16"}, "precision must be one of"),
    ("pipeline_parallel", {"timing_steps": 0}, "timing_steps must be an int >= 1"),
])
def test_bad_params_are_refused_naming_lesson_and_parameter(name, over, match):
    with pytest.raises(ValueError, match=rf"lesson '{name}'.*{match}"):
        MODULES[name].check_params(_params(name, **over))


@pytest.mark.parametrize("name", list(NEW))
def test_unknown_parameter_is_refused_before_any_gpu_work(name):
    with pytest.raises(ValueError, match="has no parameter 'size_mib'; its parameters are"):
        lessons.run(name, quick=True, size_mib=3)


@no_gpu_only
@pytest.mark.parametrize("name", list(NEW))
def test_without_a_gpu_the_lessons_raise_no_device_error(name):
    with pytest.raises(cudalab.NoDeviceError):
        lessons.run(name, quick=True)


# ---- how many GPUs, and what a lesson says with fewer ----------------------------------------


def test_gpu_counts():
    assert M.gpus_used(None, 4) == 4 and M.gpus_used(2, 4) == 2 and M.gpus_used(8, 2) == 2
    assert M.device_counts(None, 3) == (1, 2, 3)
    assert M.device_counts((4, 2), 2) == (1, 2)
    assert M.device_counts((2,), 1) == (1,)
    assert M.check_gpus("x", None) is None and M.check_gpus("x", 3) == 3


def test_needs_text_names_what_is_needed_and_what_ran():
    text = M.needs_text("Copies between GPUs", 2, 1)
    assert "needs 2 GPUs" in text and "shows 1" in text and "one-GPU part ran" in text
    assert "3-GPU part" in M.needs_text("x", 4, 3)


def test_scaling_efficiency():
    assert M.scaling_efficiency(390.0, 200.0, 2) == pytest.approx(0.975)
    assert M.scaling_efficiency(100.0, 100.0, 1) == 1.0
    assert math.isnan(M.scaling_efficiency(1.0, 0.0, 2))


# ---- the workers' JSON ----------------------------------------------------------------------


def _doc(rank, world, **extra):
    return {"rank": rank, "world_size": world, "error": None, **extra}


def test_parse_worker_results_in_rank_order_from_dicts_and_text():
    got = M.parse_worker_results({1: json.dumps(_doc(1, 2, x=1)), 0: _doc(0, 2, x=0)}, 2)
    assert [d["x"] for d in got] == [0, 1]


@pytest.mark.parametrize("docs,returncode,match", [
    ({0: _doc(0, 2)}, 1, r"exited with status 1; rank 1 wrote no result"),
    ({0: _doc(0, 2), 1: {"rank": 1, "world_size": 2, "error": "Traceback...\nValueError: bad"}},
     1, r"rank 1 failed:\nTraceback...\nValueError: bad"),
    ({0: "{not json", 1: _doc(1, 2)}, 0, "rank 0 wrote malformed JSON"),
    ({0: [1], 1: _doc(1, 2)}, 0, "rank 0 wrote a list, not an object"),
    ({0: _doc(0, 2), 1: _doc(0, 2)}, 0, "rank 1's result says rank 0 of 2"),
    ({0: _doc(0, 2), 1: _doc(1, 3)}, 0, "rank 1's result says rank 1 of 3"),
    ({0: _doc(0, 2), 1: _doc(1, 2)}, 124, "every rank wrote a result but the launcher failed"),
    ({0: _doc(0, 1), 3: _doc(3, 1)}, 0, r"results from unexpected ranks \[3\]"),
])
def test_parse_worker_results_explains_each_failure(docs, returncode, match):
    with pytest.raises(M.WorkersFailed, match=match) as info:
        M.parse_worker_results(docs, max(2, len(docs)) if 3 not in docs else 1,
                               returncode=returncode, what="test workers")
    assert str(info.value).startswith("test workers: ")
    assert isinstance(info.value, cudalab.CudalabError)


def test_parse_keeps_only_the_traceback_tail():
    err = "x" * 5000 + "END"
    with pytest.raises(M.WorkersFailed) as info:
        M.parse_worker_results({0: {"rank": 0, "world_size": 1, "error": err}}, 1)
    assert str(info.value).endswith("END") and len(str(info.value)) < M.TRACEBACK_TAIL + 200


def test_run_worker_writes_its_result_and_read_back(tmp_path, monkeypatch):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"params": {"n": 3}}))
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        status = M.run_worker(lambda c, r, w: {"twice": 2 * c["params"]["n"], "r": r, "w": w},
                              ["--config", str(config), "--out", str(tmp_path)])
        assert status == 0
    got = M.read_worker_results(tmp_path, 2)
    assert [(d["twice"], d["r"], d["w"], d["rank"]) for d in got] == [(6, 0, 2, 0), (6, 1, 2, 1)]
    assert not list(tmp_path.glob("*.partial"))


def test_run_worker_records_what_raised_and_exits_1(tmp_path, monkeypatch, capsys):
    config = tmp_path / "config.json"
    config.write_text("{}")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")

    def body(c, r, w):
        raise RuntimeError("the collective timed out")

    assert M.run_worker(body, ["--config", str(config), "--out", str(tmp_path)]) == 1
    doc = json.loads((tmp_path / "rank1.json").read_text())
    assert doc["rank"] == 1 and "RuntimeError: the collective timed out" in doc["error"]
    assert "the collective timed out" in capsys.readouterr().err
    with pytest.raises(M.WorkersFailed, match="rank 0 wrote no result; rank 1 failed"):
        M.read_worker_results(tmp_path, 2, returncode=1)


def test_launch_workers_runs_the_module_through_the_launcher(monkeypatch):
    import cudalab.distributed.run as launcher

    seen = {}

    def launch(argv, nproc, *, timeout=None, **kw):
        seen.update(argv=argv, nproc=nproc, timeout=timeout, kw=kw)
        out = argv[argv.index("--out") + 1]
        config = json.loads(open(argv[argv.index("--config") + 1]).read())
        for rank in range(nproc):
            with open(f"{out}/rank{rank}.json", "w") as f:
                json.dump(_doc(rank, nproc, got=config["x"]), f)
        return 0

    monkeypatch.setattr(launcher, "launch", launch)
    got = M.launch_workers("cudalab.lessons._allreduce_worker", 2, {"x": 5}, 10.0, "w")
    assert [d["got"] for d in got] == [5, 5]
    assert seen["argv"][:2] == ["-m", "cudalab.lessons._allreduce_worker"]
    assert seen["nproc"] == 2 and seen["timeout"] == 10.0 + M.LAUNCH_OVERHEAD_S
    assert seen["kw"] == {}, "the environment is the caller's: no env= given"


def test_worker_modules_are_not_lessons_and_import_without_a_gpu():
    import importlib

    for name in ("_allreduce_worker", "_ddp_worker"):
        mod = importlib.import_module(f"cudalab.lessons.{name}")
        assert callable(mod.body)
    assert "_allreduce_worker" not in lessons.names()


# ---- fixed-count timing inside workers -------------------------------------------------------


class _Event:
    clock = [0.0]

    def record(self):
        self.t = self.clock[0]

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3  # ms, as CUDA events give it


def test_timed_repeats_makes_the_same_calls_every_time():
    calls, barriers = [], []
    _Event.clock = [0.0]

    def fn():
        calls.append(1)
        _Event.clock[0] += 2e-6

    times = M.timed_repeats(fn, calls=10, repeats=7, warmup=3, make_event=_Event,
                            barrier=lambda: barriers.append(1))
    assert len(calls) == 3 + 7 * 10 and len(barriers) == 7
    assert times == pytest.approx([2e-6] * 7)


def test_host_loop_times_per_call():
    calls, syncs = [], []
    times = M.host_loop_times(lambda: calls.append(1), calls=5, repeats=4, warmup=2,
                              barrier=lambda: None, synchronize=lambda: syncs.append(1))
    assert len(calls) == 2 + 4 * 5 and len(syncs) == 1 + 4 and len(times) == 4
    assert all(t >= 0 for t in times)


def test_repeat_plan_is_bounded_and_deterministic():
    assert M.repeat_plan(20e-6, target_repeat_s=2e-3, budget_s=1.0, repeats=20) == (100, 20)
    assert M.repeat_plan(0.05, target_repeat_s=2e-3, budget_s=1.0, repeats=20) == (1, 20)
    assert M.repeat_plan(0.5, target_repeat_s=2e-3, budget_s=1.0, repeats=20) == (1, 5)
    assert M.repeat_plan(0.0, target_repeat_s=2e-3, budget_s=1.0, repeats=20)[0] == 100


def test_slowest_measurement_is_the_slowest_ranks():
    per_rank = [{"times": [1e-3, 1.1e-3, 0.9e-3], "calls": 4, "device": 0, "device_name": "G"},
                {"times": [2e-3, 2.2e-3, 1.8e-3], "calls": 4, "device": 1, "device_name": "G"}]
    m = M.slowest_measurement("all_reduce 1 MiB", per_rank, bytes=2**20)
    assert isinstance(m, Measurement) and m.median == pytest.approx(2e-3)
    assert m.metadata["slowest_rank"] == 1 and m.metadata["world_size"] == 2
    assert m.metadata["rank_medians"] == pytest.approx([1e-3, 2e-3])
    assert m.number_per_run == 4 and m.device_index == 1 and m.bytes == 2**20
    with pytest.raises(ValueError, match="rank 1 has no times"):
        M.slowest_measurement("x", [per_rank[0], {"times": []}])


# ---- allreduce: the arithmetic -----------------------------------------------------------------


def test_bus_bandwidth_as_nccl_tests_counts_it():
    assert A.bus_factor(1) == 0.0 and A.bus_factor(2) == 1.0 and A.bus_factor(8) == 1.75
    assert A.algbw(1e9, 0.01) == pytest.approx(1e11)
    assert A.busbw(1e9, 0.01, 4) == pytest.approx(1e11 * 1.5)
    assert A.algbw(8, 0.0) == math.inf
    with pytest.raises(ValueError):
        A.bus_factor(0)


def test_sizes_that_fit_free_memory():
    assert A.sizes_that_fit((8, 1 << 30, 4 << 30), 20 * 2**30, 5) == (8, 1 << 30)
    assert A.sizes_that_fit((1 << 30,), 1 << 30, 4) == ()


def test_parity_from_one_mib():
    pairs = [(8, 0.5), (1 << 20, 0.98), (1 << 30, 1.02), (4 << 30, 0.99)]
    assert A.parity_span(pairs) == (0.98, 1 << 20, 1.02, 1 << 30)
    assert A.parity_span([(8, 0.5)]) is None
    assert "level with it or faster at every size" in A.parity_text(A.parity_span(pairs), 2)
    low = A.parity_text((0.9, 1 << 20, 1.0, 1 << 30), 2)
    assert "below parity (0.97x) at 1 MiB" in low


def test_latency_text_follows_the_graph_threshold():
    assert "launching from Python is a real share" in A.latency_text(20e-6, 8e-6, 43e-6, 2)
    assert "torch.distributed's loop 43.0 us" in A.latency_text(20e-6, 8e-6, 43e-6, 2)
    assert "the collective itself" in A.latency_text(10e-6, 9.5e-6, None, 1)


def _ar_rank(rank, world, sizes, slow=1.0, torch=True):
    """A worker's result: time per call = (10 us + bytes / 100 GB/s) * slow; torch 5% slower."""
    def times(b, f):
        t = (10e-6 + b / 100e9) * slow * f
        return [t * x for x in (0.98, 0.99, 1.0, 1.01, 1.02)]

    entries = []
    for b in sizes:
        e = {"bytes": b, "count": b // 4, "calls": 3, "repeats": 5, "error": 0.0,
             "cudalab": times(b, 1.0)}
        if torch:
            e.update(torch=times(b, 1.05), torch_error=0.0)
        entries.append(e)
    latency = {"bytes": 8, "cudalab loop": {"times": [12e-6 * slow] * 5, "calls": 100},
               "cudalab graph": {"times": [5e-6 * slow] * 5, "calls": 100, "graph_calls": 50}}
    if torch:
        latency["torch loop"] = {"times": [40e-6] * 5, "calls": 100}
    return {"rank": rank, "world_size": world, "error": None, "device": rank,
            "device_name": "Fake GPU", "nccl": "2.28.9", "nccl_library": "libnccl.so.2",
            "torch": "2.11" if torch else None, "torch_nccl": "2.27.5" if torch else None,
            "host": "h", "sizes": entries, "latency": latency}


def _run_allreduce(monkeypatch, world, present, torch=True):
    sizes = (8, 4096, 1 << 20, 64 << 20)
    seen = {}

    def launch(module, nproc, config, timeout, what):
        seen.update(module=module, nproc=nproc, config=config)
        return [_ar_rank(r, nproc, config["params"]["sizes"], slow=1 + 0.1 * r,
                         torch=config["params"]["torch"]) for r in range(nproc)]

    monkeypatch.setattr(M, "launch_workers", launch)
    monkeypatch.setattr(M, "gpu_count", lambda: present)
    monkeypatch.setattr(cudalab, "mem_get_info", lambda d=None: (80 << 30, 80 << 30),
                        raising=False)
    monkeypatch.setattr(registry.LessonRun, "torch",
                        staticmethod(lambda: object() if torch else None))
    x = lessons.get("allreduce")
    r = registry.LessonRun(x, {**x.defaults(True), "sizes": sizes, "gpus": world}, True)
    x.function(r)
    return r, seen


def _result(r):
    return LessonResult(lesson=r.lesson.name, number=r.lesson.number, title=r.lesson.title,
                        seed=r.lesson.seed, params=dict(r.params), quick=True,
                        device={"name": "Fake GPU"}, env={}, measurements=dict(r.measurements),
                        rows=tuple(r.rows), findings=tuple(r.findings), claims=tuple(r.claims),
                        checks=tuple(r.checks), wall_seconds=1.0, created="now")


def _round_trip_and_plot(r):
    res = _result(r)
    back = LessonResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back.rows == res.rows and back.claims == res.claims and back.checks == res.checks
    assert res.table()
    for f in r.findings:
        assert set(f.labels) <= set(r.measurements), f
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    res.plot()


def test_allreduce_on_two_gpus_from_worker_results(monkeypatch):
    r, seen = _run_allreduce(monkeypatch, 2, 2)
    assert seen["module"] == "cudalab.lessons._allreduce_worker" and seen["nproc"] == 2
    assert seen["config"]["params"]["torch"] is True
    assert {tuple(row) for row in r.rows} == {A.ROW_KEYS}
    sweep = [x for x in r.rows if x["part"] == "sweep" and x["impl"] == "cudalab"]
    assert [x["bytes"] for x in sweep] == [8, 4096, 1 << 20, 64 << 20]
    one_mib = next(x for x in sweep if x["bytes"] == 1 << 20)
    t = (10e-6 + 2**20 / 100e9) * 1.1  # the slower rank's median
    assert one_mib["us"] == pytest.approx(t * 1e6)
    assert one_mib["busbw_gbps"] == pytest.approx(2**20 / t / 1e9)  # factor 1 on 2 ranks
    assert one_mib["torch_over_ours"] == pytest.approx(1.05)  # both slowest on rank 1
    assert one_mib["slowest_rank"] == 1
    assert len(r.checks) == 8 and all(c.passed for c in r.checks)
    claims = {c.claim.split(":")[0]: c for c in r.claims}
    assert len(r.claims) == 3
    graph = next(c for c in r.claims if "CUDA graphs" in c.claim)
    assert graph.held and graph.measured == pytest.approx(12 / 5)
    loop = next(c for c in r.claims if "Python loop" in c.claim)
    assert loop.held and loop.measured == pytest.approx(13.2) and loop.tutorial == 43.0
    assert claims
    assert any("peaks at" in f.text for f in r.findings)
    assert any("From 1 MiB up on 2 GPUs" in f.text for f in r.findings)
    assert not any("needs 2 GPUs" in f.text for f in r.findings)
    _round_trip_and_plot(r)


def test_allreduce_on_one_gpu_says_what_the_rest_needs(monkeypatch):
    r, seen = _run_allreduce(monkeypatch, None, 1, torch=False)
    assert seen["nproc"] == 1 and seen["config"]["params"]["torch"] is False
    assert any("needs 2 GPUs" in f.text and "busbw is 0" not in f.text
               and "bus bandwidth is 0 by definition" in f.text for f in r.findings)
    assert all(x["busbw_gbps"] == 0 for x in r.rows if x["part"] == "sweep")
    assert not any("Python loop" in c.claim for c in r.claims)  # a world of 1 is no test of it
    assert not any(x["impl"] == "torch" for x in r.rows)
    _round_trip_and_plot(r)


def test_allreduce_wrong_sum_fails_its_check(monkeypatch):
    def launch(module, nproc, config, timeout, what):
        docs = [_ar_rank(r, nproc, config["params"]["sizes"]) for r in range(nproc)]
        docs[1]["sizes"][2]["error"] = 0.5
        return docs

    monkeypatch.setattr(M, "launch_workers", launch)
    monkeypatch.setattr(M, "gpu_count", lambda: 2)
    monkeypatch.setattr(cudalab, "mem_get_info", lambda d=None: (80 << 30, 80 << 30),
                        raising=False)
    monkeypatch.setattr(registry.LessonRun, "torch", staticmethod(lambda: None))
    x = lessons.get("allreduce")
    r = registry.LessonRun(x, x.defaults(True), True)
    with pytest.raises(lessons.LessonCheckError, match="all_reduce of 1 MiB"):
        x.function(r)


def test_worker_error_reaches_the_lesson(monkeypatch):
    def launch(module, nproc, config, timeout, what):
        return M.parse_worker_results({0: {"rank": 0, "world_size": 2,
                                           "error": "NcclError: ncclSystemError"}}, 2,
                                      returncode=1, what=what)

    monkeypatch.setattr(M, "launch_workers", launch)
    monkeypatch.setattr(M, "gpu_count", lambda: 2)
    monkeypatch.setattr(cudalab, "mem_get_info", lambda d=None: (80 << 30, 80 << 30),
                        raising=False)
    monkeypatch.setattr(registry.LessonRun, "torch", staticmethod(lambda: None))
    x = lessons.get("allreduce")
    with pytest.raises(M.WorkersFailed, match="(?s)lesson 'allreduce': 2 worker.*ncclSystem"):
        x.function(registry.LessonRun(x, x.defaults(True), True))


# ---- p2p: the arithmetic and the findings -------------------------------------------------------


def test_ordered_pairs():
    assert P.ordered_pairs(1) == []
    assert P.ordered_pairs(3) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]


def test_peer_text_follows_the_threshold():
    on, off = (2e-6, 300e9), (10e-6, 20e9)
    assert "makes a 1 GiB copy 15.00x faster" in P.peer_text(0, 1, on, off, 15.0, 1 << 30)
    assert "changes nothing that matters" in P.peer_text(0, 1, on, on, 1.02, 1 << 30)
    assert "made a 1 GiB copy slower" in P.peer_text(0, 1, on, off, 0.5, 1 << 30)
    assert "could not be turned off and on" in P.peer_text(1, 0, on, None, None, 1 << 30)


def test_local_text():
    assert "the link keeps up" in P.local_text(900e9, 1000e9, 1 << 30)
    assert "the link, not the GPU's memory" in P.local_text(100e9, 1000e9, 1 << 30)
    assert "10% of a copy within one GPU" in P.local_text(100e9, 1000e9, 1 << 30)
    unused = P.local_text(37e9, 2000e9, 1 << 30, 370e9)
    assert "torch's .to moves 370.0 GB/s" in unused and "carries 10.0x more" in unused
    assert "the link, not the GPU's memory" in P.local_text(100e9, 1000e9, 1 << 30, 110e9)


def _copy_ms(label, nbytes, latency, bandwidth):
    return fake_measurement(label, median=latency + nbytes / bandwidth, bytes=float(nbytes))


def _p2p_numbers(n, sizes):
    local = {d: {s: _copy_ms(P._label("copy", d, d, s), s, 3e-6, 1500e9) for s in sizes}
             for d in range(n)}
    results = {}
    for i, j in P.ordered_pairs(n):
        results[(i, j)] = {
            "peer on": {s: _copy_ms(P._label("peer on", i, j, s), s, 4e-6, 300e9) for s in sizes},
            "peer off": {s: _copy_ms(P._label("peer off", i, j, s), s, 15e-6, 20e9) for s in sizes},
            ".to": {s: _copy_ms(P._label(".to", i, j, s), s, 6e-6, 290e9) for s in sizes},
            "torch .to": {s: _copy_ms(P._label("torch .to", i, j, s), s, 12e-6, 280e9)
                          for s in sizes},
            "staged via host": {s: _copy_ms(P._label("staged via host", i, j, s), s, 30e-6, 25e9)
                                for s in sizes}}
    return local, results


def _p2p_run(n, present):
    x = lessons.get("p2p")
    sizes = (4096, 1 << 26)
    r = registry.LessonRun(x, {**x.defaults(True), "sizes": sizes}, True)
    local, results = _p2p_numbers(n, sizes)
    for group in [local, *results.values()]:
        for ms in group.values():
            for m in ms.values():
                r.add(m)
    state = {pair: False for pair in P.ordered_pairs(n)}
    P._rows(r, local, results, sizes)
    P._findings(r, local, results, state, sizes, n, present)
    return r


def test_p2p_findings_and_claims_from_given_numbers():
    r = _p2p_run(2, 2)
    assert {tuple(row) for row in r.rows} == {P.ROW_KEYS}
    on = [x for x in r.rows if x["path"] == "peer on" and x["src"] == 0]
    assert on[0]["fit_gbps"] == pytest.approx(300, rel=1e-6)
    assert on[0]["fit_latency_us"] == pytest.approx(4, rel=1e-6)
    direct = next(c for c in r.claims if "far faster than through the host" in c.claim)
    peer = next(c for c in r.claims if "Enabling peer access" in c.claim)
    assert direct.held and peer.held and peer.measured > 10
    assert any("2 of 2 ordered pairs" in f.text for f in r.findings)
    assert any("torch takes" in f.text for f in r.findings)
    _round_trip_and_plot(r)


def test_p2p_on_one_gpu_measures_the_device_and_says_what_it_needs():
    r = _p2p_run(1, 1)
    assert [f for f in r.findings if "Within device 0" in f.text]
    assert any("needs 2 GPUs" in f.text for f in r.findings)
    assert not r.claims


def test_torch_to_pairs_with_cudalab_to():
    from cudalab.lessons.versus import versus_torch

    r = _p2p_run(2, 2)
    pairs = versus_torch(_result(r))
    assert pairs and all(p.label.startswith(".to ") and p.torch_label.startswith("torch .to ")
                         for p in pairs)


# ---- data_parallel: the arithmetic, the mistakes, end to end on worker results -----------------


def test_hidden_fraction():
    assert D.hidden_fraction(10.0, 4.0, 11.0) == pytest.approx(0.75)
    assert D.hidden_fraction(10.0, 4.0, 14.5) == 0.0
    assert D.hidden_fraction(10.0, 4.0, 9.0) == 1.0
    assert math.isnan(D.hidden_fraction(10.0, 0.0, 10.0))


def test_rank_as_device_on_a_two_by_two_job():
    c = D.rank_as_device()
    assert (c["rank"], c["world_size"], c["node_rank"], c["nnodes"]) == (2, 4, 1, 2)
    assert (c["tutorial_device"], c["right_device"], c["exists"]) == (2, 0, False)
    text = D.rank_as_device_text(c)
    assert "set_device(2), a GPU its node does not have" in text and "local rank, 0" in text
    single = D.rank_as_device({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"})
    assert single["exists"] and single["tutorial_device"] == single["right_device"] == 1


def test_sharding_and_inference_texts():
    assert D.rows_seen(64, 4, True) == 256 and D.rows_seen(64, 4, False) == 64
    text = D.sharding_text(64, 2, 1e-7, 0.4)
    assert "the same 64 rows" in text and "not of 128 rows" in text
    assert "the effective batch stays 64" in text
    assert "happen to be close" in D.sharding_text(64, 2, 1e-7, 1e-3)
    inf = D.inference_text("torch", 1e-3, 1.2e-3, 2, 256)
    assert "+200 us" in inf and "1.000 ms bare" in inf


def test_labels_pair_torch_with_cudalab():
    assert D.label("plain", 1, 8192) == "1 GPU b8192"
    assert D.label("torch plain", 1, 256) == "torch 1 GPU b256"
    assert D.label("plain", 2, 256) == "no sync 2 GPUs b256"
    assert D.label("ddp bf16", 2, 256) == "ddp bf16 grads 2 GPUs b256"
    assert D.label("torch ddp fp32", 4, 8) == "torch ddp fp32 grads 4 GPUs b8"
    assert D.label("comm fp32", 2, None) == "all_reduce grads fp32 2 GPUs"
    assert D.label("ddp forward", 2, 8) == "ddp forward 2 GPUs b8"
    assert D.label("torch forward", 2, 8) == "torch forward 2 GPUs b8"


def _t(ms):
    return [ms * 1e-3 * f for f in (0.98, 0.99, 1.0, 1.01, 1.02)]


def _ddp_rank(rank, world, batches, torch=True):
    """Step times: compute 10 ms per 8192 rows; DDP adds what the backward does not hide."""
    entries = []
    for b in batches:
        compute = 10.0 * b / 8192 + 0.5
        e = {"batch": b, "plain": {"times": _t(compute), "calls": 1},
             "forward": {"times": _t(compute / 3), "calls": 1}}
        if world > 1:
            e.update({"ddp fp32": {"times": _t(compute + 1.0), "calls": 1},
                      "ddp bf16": {"times": _t(compute + 0.4), "calls": 1},
                      "ddp forward": {"times": _t(compute / 3 + 0.001), "calls": 1}})
        if torch:
            e.update({"torch plain": {"times": _t(compute * 1.2), "calls": 1},
                      "torch forward": {"times": _t(compute / 3), "calls": 1}})
            if world > 1:
                e.update({"torch ddp fp32": {"times": _t(compute * 1.2 + 2.0), "calls": 1},
                          "torch ddp bf16": {"times": _t(compute * 1.2 + 1.5), "calls": 1},
                          "torch ddp forward": {"times": _t(compute / 3 + 0.05), "calls": 1}})
        entries.append(e)
    doc = {"rank": rank, "world_size": world, "error": None, "device": rank,
           "device_name": "Fake GPU", "host": "h", "nccl": "2.28.9", "torch": "2.11",
           "batches": entries, "comm": {}}
    if world > 1:
        doc["comm"] = {"fp32": {"times": _t(2.0), "calls": 1}, "fp32 bytes": 210 << 20,
                       "fp32 buckets": 9, "bf16": {"times": _t(1.0), "calls": 1},
                       "bf16 bytes": 105 << 20, "bf16 buckets": 9}
        doc["check"] = {"rows_per_rank": 16, "steps": 2, "losses": [2.0 + rank * 0.1, 1.9],
                        "same_rows_vs_local": 1e-7}
        if rank == 0:
            doc["check"].update(ref_losses=[2.0 + (world - 1) * 0.05, 1.9], grad_diff=2e-7,
                                update_diff=1e-4, same_rows_vs_global=0.3)
    return doc


def _run_data_parallel(monkeypatch, present, torch=True, **over):
    launched = []

    def launch(module, nproc, config, timeout, what):
        launched.append((module, nproc, config))
        assert config["sizes"] == [512, 4096, 4096, 4096, 4096, 16]
        docs = [_ddp_rank(r, nproc, config["batches"], torch=config["params"]["torch"])
                for r in range(nproc)]
        for d in docs[1:]:  # the check fields rank 0 adds
            d["check"] = {**docs[0]["check"], **d["check"]} if "check" in d else d.get("check")
        return docs

    monkeypatch.setattr(M, "launch_workers", launch)
    monkeypatch.setattr(M, "gpu_count", lambda: present)
    monkeypatch.setattr(registry.LessonRun, "torch",
                        staticmethod(lambda: object() if torch else None))
    x = lessons.get("data_parallel")
    params = {**x.defaults(True), "data_parallel": False, **over}
    r = registry.LessonRun(x, params, True)
    x.function(r)
    return r, launched


def test_data_parallel_on_two_gpus_from_worker_results(monkeypatch):
    r, launched = _run_data_parallel(monkeypatch, 2)
    assert [n for _, n, _ in launched] == [1, 2]
    assert all(m == "cudalab.lessons._ddp_worker" for m, _, _ in launched)
    assert {tuple(row) for row in r.rows} == {D.ROW_KEYS}
    ddp = {(x["impl"], x["grads"], x["batch_per_gpu"]): x for x in r.rows
           if x["part"] == "ddp" and x["gpus"] == 2}
    bf16 = ddp[("cudalab", "bf16", 2048)]
    compute = 10.0 * 2048 / 8192 + 0.5
    assert bf16["samples_per_s"] == pytest.approx(2 * 2048 / ((compute + 0.4) * 1e-3))
    assert bf16["efficiency"] == pytest.approx(compute / (compute + 0.4))
    assert bf16["hidden"] == pytest.approx(0.6) and bf16["comm_ms"] == pytest.approx(1.0)
    assert all(c.passed for c in r.checks) and len(r.checks) == 3
    assert any("parameters' updates on 2 GPUs differ" in f.text for f in r.findings)
    texts = " | ".join(f.text for f in r.findings)
    assert "Tutorial mistake 1" in texts and "Tutorial mistake 2" in texts
    assert "Tutorial mistake 3" in texts and "hides 60% of the communication" in texts
    claims = {c.claim: c for c in r.claims}
    assert not next(c for k, c in claims.items() if "set_device(rank)" in k).held
    overlap = next(c for k, c in claims.items() if "overlaps" in k)
    assert overlap.held and overlap.measured == pytest.approx(0.6)
    large = next(c for k, c in claims.items() if "batch of 2048" in k)
    assert large.measured == pytest.approx(2 * compute / (compute + 0.4))
    assert not any("needs 2 GPUs" in f.text for f in r.findings)
    _round_trip_and_plot(r)


def test_data_parallel_checks_fail_on_a_wrong_gradient(monkeypatch):
    def launch(module, nproc, config, timeout, what):
        docs = [_ddp_rank(r, nproc, config["batches"]) for r in range(nproc)]
        if nproc > 1:
            docs[0]["check"]["grad_diff"] = 0.5  # gradients summed, not averaged, say
        return docs

    monkeypatch.setattr(M, "launch_workers", launch)
    monkeypatch.setattr(M, "gpu_count", lambda: 2)
    monkeypatch.setattr(registry.LessonRun, "torch", staticmethod(lambda: None))
    x = lessons.get("data_parallel")
    r = registry.LessonRun(x, {**x.defaults(True), "data_parallel": False}, True)
    with pytest.raises(lessons.LessonCheckError, match="averaged gradients"):
        x.function(r)


def test_data_parallel_on_one_gpu_is_the_baseline_and_says_what_it_needs(monkeypatch):
    r, launched = _run_data_parallel(monkeypatch, 1, torch=False)
    assert [n for _, n, _ in launched] == [1]
    assert any("needs 2 GPUs" in f.text for f in r.findings)
    assert any("Tutorial mistake 1" in f.text for f in r.findings)  # needs no GPU at all
    assert [x["gpus"] for x in r.rows if x["part"] == "ddp"] == [1, 1]
    assert not r.checks
    _round_trip_and_plot(r)


def test_data_parallel_claims_from_a_given_dataparallel_run():
    x = lessons.get("data_parallel")
    r = registry.LessonRun(x, x.defaults(True), True)
    found = {1: {("plain", 256): fake_measurement("1 GPU b256", median=1e-3)},
             2: {("ddp fp32", 256): fake_measurement("ddp fp32 grads 2 GPUs b256", median=1.2e-3),
                 ("ddp bf16", 256): fake_measurement("ddp bf16 grads 2 GPUs b256", median=1.1e-3),
                 ("plain", 256): fake_measurement("no sync 2 GPUs b256", median=1e-3)}}
    comm = {2: {"bf16": fake_measurement("all_reduce grads bf16 2 GPUs", median=0.5e-3)}}
    dp = {"times": {(1, 256): fake_measurement("1 GPU b256 (lesson process)", median=1e-3),
                    (2, 256): fake_measurement("DataParallel 2 GPUs b256", median=1.6e-3)},
          "split": {(2, 256): [(0, 256), (256, 512)]},
          "traffic": {(2, 256): {"replicate": 100 << 20, "scatter": 1 << 20, "gather": 1 << 20,
                                 "reduce": 200 << 20, "total": 302 << 20}}}
    for group in (found[1], found[2], comm[2], dp["times"]):
        for m in group.values():
            r.add(m)
    D._dp_findings(r, found, dp, (256,), 2)
    D._claims(r, found, comm, (256,), dp, 2)
    claims = {c.claim: c for c in r.claims}
    split = next(c for k, c in claims.items() if "splits the batch" in k)
    assert split.held and split.measured == 2 and "[256, 256]" in split.why
    preferred = next(c for k, c in claims.items() if "preferred" in k)
    assert preferred.held and preferred.measured == pytest.approx(1.6 / 1.1)
    overlap = next(c for k, c in claims.items() if "overlaps" in k)
    assert overlap.measured == pytest.approx(0.8)
    target = next(c for k, c in claims.items() if "issue 20" in k)
    assert target.measured == pytest.approx(2 / 1.1) and not target.held
    assert any("302 MiB between GPUs" in f.text for f in r.findings)


# ---- multi_gpu_inference -------------------------------------------------------------------------


def test_inference_scaling_text_follows_the_thresholds():
    assert "side by side" in I.scaling_text("cudalab", "graph", 2, 1960.0, 1000.0)
    assert "close to linear" in I.scaling_text("cudalab", "eager", 2, 1850.0, 1000.0)
    assert "far from linear" in I.scaling_text("cudalab", "eager", 2, 1200.0, 1000.0)


def test_inference_findings_and_claim_from_given_numbers():
    x = lessons.get("multi_gpu_inference")
    r = registry.LessonRun(x, x.defaults(True), True)
    b = 32
    ours = {(mode, k): r.add(fake_measurement(I._label("cudalab", mode, k, b, "fp16"),
                                              median=t))
            for (mode, k), t in {("eager", 1): 10e-3, ("eager", 2): 10.4e-3,
                                 ("graph", 1): 9e-3, ("graph", 2): 9.1e-3}.items()}
    theirs = {(mode, k): r.add(fake_measurement(I._label("torch", mode, k, b, "fp16"), median=t))
              for (mode, k), t in {("channels_last", 1): 15e-3,
                                   ("channels_last", 2): 15.5e-3}.items()}
    I._rows(r, ours, theirs, b)
    I._findings(r, ours, theirs, 2, 2, b, "fp16", ["eager", "graph"])
    assert {tuple(row) for row in r.rows} == {I.ROW_KEYS}
    [claim] = r.claims
    assert claim.measured == pytest.approx(2 * 9e-3 / 9.1e-3) and claim.held
    assert any("torchvision's resnet50 (channels_last) as 2 replica(s)" in f.text
               for f in r.findings)
    tc = next(x for x in r.rows if x["impl"] == "torch" and x["gpus"] == 2)
    assert tc["speedup"] == pytest.approx(2 * 15e-3 / 15.5e-3)
    assert I._torch_label_twin("torch 2 GPUs b2x32 fp16 channels_last") == "2 GPUs b2x32 fp16 eager"
    _round_trip_and_plot(r)


def test_inference_on_one_gpu_says_what_it_needs():
    x = lessons.get("multi_gpu_inference")
    r = registry.LessonRun(x, x.defaults(True), True)
    ours = {("eager", 1): r.add(fake_measurement("1 GPU b1x32 fp16 eager", median=1e-2))}
    I._findings(r, ours, {}, 1, 1, 32, "fp16", ["eager"])
    assert any("needs 2 GPUs" in f.text for f in r.findings) and not r.claims


# ---- pipeline_parallel: the bubble from given numbers ------------------------------------------


def test_gpipe_bubble():
    assert PP.gpipe_bubble(2, 1) == 0.5 and PP.gpipe_bubble(2, 8) == pytest.approx(1 / 9)
    assert PP.gpipe_bubble(4, 4) == pytest.approx(3 / 7) and PP.gpipe_bubble(1, 8) == 0.0
    with pytest.raises(ValueError):
        PP.gpipe_bubble(0, 1)


def test_measured_and_schedule_bubble():
    assert PP.measured_bubble(10.0, [8.0, 6.0]) == pytest.approx(0.3)
    assert math.isnan(PP.measured_bubble(0.0, [1.0]))
    # Two equal stages, 4 micro-batches of 1 ms forward and 2 ms backward: the schedule is
    # (1 + 1 + 3) + (2 + 2 + 6) = 15 ms, each stage busy 12 ms: GPipe's 1/5.
    fwd, bwd = [[1.0] * 4, [1.0] * 4], [[2.0] * 4, [2.0] * 4]
    assert PP.schedule_step(fwd, bwd) == pytest.approx(15.0)
    assert PP.schedule_bubble(fwd, bwd) == pytest.approx(PP.gpipe_bubble(2, 4))
    # An unequal second stage makes the schedule's bubble larger than GPipe's formula.
    assert PP.schedule_bubble([[1.0] * 4, [2.0] * 4], [[2.0] * 4, [4.0] * 4]) > 0.2


def test_utilisation_ratio_and_bubble_text():
    assert PP.utilisation_ratio(0.2, 0.2) == 1.0
    assert PP.utilisation_ratio(0.3, 0.2) == pytest.approx(0.875)
    ok = PP.bubble_text(2, 8, 12.0, 0.12, 0.111, 0.115)
    assert "2 stages, 8 micro-batches" in ok and "busy 0.99x" in ok
    uneven = PP.bubble_text(2, 8, 12.0, 0.3, 0.111, 0.28)
    assert "unequal stages" in uneven
    rest = PP.bubble_text(2, 8, 12.0, 0.3, 0.111, 0.12)
    assert "copies, launches and thinner micro-batch GEMMs" in rest


def test_stage_counts():
    assert PP.stage_counts(1, 5) == (1,)
    assert PP.stage_counts(4, 5) == (2, 3, 4) and PP.stage_counts(8, 3) == (2, 3)


def _timings(step, fwd, bwd):
    busy = [sum(f) + sum(b) for f, b in zip(fwd, bwd)]
    return types.SimpleNamespace(step_ms=step, forward_ms=fwd, backward_ms=bwd, busy_ms=busy)


def test_pipeline_findings_and_claims_from_given_numbers():
    x = lessons.get("pipeline_parallel")
    r = registry.LessonRun(x, x.defaults(True), True)
    one = {"time": r.add(fake_measurement(PP.ONE_GPU, median=20e-3)), "peak": [1000 << 20]}
    results = {}
    for m, step in ((1, 24.0), (4, 16.0)):
        fwd = [[4.0 / m] * m, [4.0 / m] * m]
        bwd = [[8.0 / m] * m, [8.0 / m] * m]
        t = _timings(step, fwd, bwd)
        results[(2, m)] = {"time": r.add(fake_measurement(PP._label("cudalab", 2, m),
                                                          median=step * 1e-3)),
                           "peak": [550 << 20, 560 << 20], "timings": t,
                           "bubble": PP.measured_bubble(t.step_ms, t.busy_ms),
                           "schedule": PP.schedule_bubble(fwd, bwd),
                           "gpipe": PP.gpipe_bubble(2, m)}
    theirs = {m: r.add(fake_measurement(PP._label("torch", 2, m), median=t))
              for m, t in ((1, 30e-3), (4, 22e-3))}
    PP._rows(r, one, results, theirs)
    PP._findings(r, one, results, theirs, 2, 2)
    assert {tuple(row) for row in r.rows} == {PP.ROW_KEYS}
    assert results[(2, 4)]["bubble"] == pytest.approx(0.25)
    claims = {c.claim.split(":")[0]: c for c in r.claims}
    gpipe = next(c for c in r.claims if c.claim.startswith("GPipe"))
    assert gpipe.tutorial == pytest.approx(0.2) and gpipe.measured == pytest.approx(0.25)
    assert gpipe.held  # busy 0.75 against GPipe's 0.8: 0.94x, within 10%
    pipelining = next(c for c in r.claims if "Pipelining" in c.claim)
    assert pipelining.held and pipelining.measured == pytest.approx(1.5)
    memory = next(c for c in r.claims if "Splitting the model" in c.claim)
    assert memory.held and memory.measured == pytest.approx(560 / 1000)
    assert claims
    _round_trip_and_plot(r)


def test_pipeline_gpipe_claim_threshold():
    # Utilisation within 10% of GPipe's holds: bubble 0.25 vs 0.2 is 0.9375x: held.
    assert PP.utilisation_ratio(0.25, 0.2) == pytest.approx(0.9375)
    assert PP.utilisation_ratio(0.25, 0.2) >= 1 - PP.BUBBLE_TOLERANCE


def test_pipeline_on_one_gpu_says_what_it_needs():
    x = lessons.get("pipeline_parallel")
    r = registry.LessonRun(x, x.defaults(True), True)
    one = {"time": r.add(fake_measurement(PP.ONE_GPU, median=10e-3)), "peak": [1 << 30]}
    t = _timings(12.0, [[1.0] * 4], [[2.0] * 4])
    results = {(1, 4): {"time": r.add(fake_measurement(PP._label("cudalab", 1, 4), median=12e-3)),
                        "peak": [1 << 30], "timings": t, "bubble": 0.0, "schedule": 0.0,
                        "gpipe": 0.0}}
    PP._findings(r, one, results, {}, 1, 1)
    assert any("needs 2 GPUs" in f.text for f in r.findings)
    assert any("thinner GEMMs" in f.text for f in r.findings) and not r.claims


# ---- benchmarks/bench_allreduce.py: the table and targets from given rows ----------------------


@pytest.fixture(scope="module")
def bench():
    from _support import REPO_ROOT, load_module

    return load_module(REPO_ROOT / "benchmarks" / "bench_allreduce.py", "_bench_allreduce_test")


def _bench_rows(bench, ranks, ratio):
    rows = []
    for b in (8, 1 << 20, 4 << 30):
        for impl, t in (("cudalab", 1e-3), ("torch", 1e-3 * ratio)):
            m = fake_measurement(f"{impl} {b}", median=t, bytes=float(b))
            rows.append(bench._row(m, impl, "sweep", b, ranks))
    m = fake_measurement("cudalab loop", median=15e-6, bytes=8.0)
    rows.append(bench._row(m, "cudalab", "host loop", 8, ranks))
    bench.compare_with_torch(rows)
    return rows


def test_bench_targets_and_table(bench):
    rows = _bench_rows(bench, 2, 1.0)
    assert all(r["op"] == "all_reduce" for r in rows)
    assert {r["impl"] for r in rows} == {"cudalab", "torch"}
    parity, loop = bench.evaluate_targets(rows)
    assert parity["held"] and parity["measured"] == pytest.approx(1.0)
    assert loop["held"] and loop["measured"] == pytest.approx(15.0)
    slow = bench.evaluate_targets(_bench_rows(bench, 2, 0.9))[0]
    assert slow["held"] is False and slow["measured"] == pytest.approx(0.9)
    table = bench.table(rows)
    assert "busbw" in table and "4 GiB" in table and "15.00 us per call" in table
    assert "Targets:" in bench.targets_text(bench.evaluate_targets(rows))


def test_bench_targets_need_two_gpus(bench):
    parity, loop = bench.evaluate_targets(_bench_rows(bench, 1, 1.0))
    assert parity["held"] is None and loop["held"] is None


def test_data_parallel_counts_the_optimizer_in_backward_variant():
    """DDP with AdamW stepped per bucket is a variant of its own: its finding compares it
    with plain bf16 DDP, and the issue's target claim takes the fastest variant."""
    x = lessons.get("data_parallel")
    r = registry.LessonRun(x, x.defaults(True), True)
    inside = f"ddp {D.OPTIM_IN_BACKWARD}"
    found = {1: {("plain", 256): fake_measurement("1 GPU b256", median=1e-3)},
             2: {("ddp fp32", 256): fake_measurement("ddp fp32 grads 2 GPUs b256", median=1.6e-3),
                 ("ddp bf16", 256): fake_measurement("ddp bf16 grads 2 GPUs b256", median=1.4e-3),
                 (inside, 256): fake_measurement(D.label(inside, 2, 256), median=1.25e-3),
                 ("plain", 256): fake_measurement("no sync 2 GPUs b256", median=1e-3)}}
    for m in (*found[1].values(), *found[2].values()):
        r.add(m)
    assert D._best_ddp(found[2], 256) == (D.OPTIM_IN_BACKWARD, found[2][(inside, 256)])
    assert D._best_ddp(found[2], 256, "torch") is None
    text = D.optim_in_backward_text(2, 256, 1.4e-3, 1.25e-3)
    assert "1.25 ms" in text and "1.40 ms" in text and "1.12x" in text and "faster" in text
    assert "no faster" in D.optim_in_backward_text(2, 256, 1.2e-3, 1.25e-3)
    D._claims(r, found, {2: {}}, (256,), None, 2)
    target = next(c for c in r.claims if "issue 20" in c.claim)
    assert target.measured == pytest.approx(2 * 1e-3 / 1.25e-3)
    assert D.OPTIM_IN_BACKWARD in target.why
