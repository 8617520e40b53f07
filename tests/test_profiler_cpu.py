"""CPU tier: cudalab.profiler without a GPU — argument errors, the profile
life cycle, host-only record_function ranges, and the table and Chrome trace
built from synthetic events."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import cudalab
from cudalab import _core, profiler
from cudalab.profiler import (
    KeyAverages,
    Profile,
    ProfilerEvent,
    chrome_trace,
    format_time_ns,
    profile,
    record_function,
)
from _support import HAS_GPU, assert_arg_error

pytestmark = pytest.mark.usefixtures("no_profile_left_running")


def ev(name, host_ns, gpu_ns=None, *, kind="op", start=0, shapes=((4,),), nbytes=None,
       flops=None, device=0, stream=0, thread_id=1, dtype="float32"):
    """A synthetic event: host [start, start + host_ns], GPU just after."""
    return ProfilerEvent(
        name=name,
        kind=kind,
        device=device,
        stream=stream,
        thread_id=thread_id,
        host_start_ns=start,
        host_end_ns=start + host_ns,
        gpu_start_ns=None if gpu_ns is None else start + 500,
        gpu_duration_ns=gpu_ns,
        dtype=dtype,
        input_shapes=shapes,
        output_shape=shapes[0] if shapes else None,
        bytes=nbytes,
        flops=flops,
    )


# ---- public names --------------------------------------------------------------


def test_public_names():
    assert "profiler" in cudalab.__all__
    assert cudalab.profiler is profiler
    for name in ("profile", "Profile", "record_function", "ProfilerEvent", "KeyAverages",
                 "KeyAverage", "chrome_trace", "SORT_KEYS"):
        assert hasattr(profiler, name)
        assert name in profiler.__all__


def test_event_is_frozen():
    e = ev("add", 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.name = "sub"  # type: ignore[misc]
    assert e.host_duration_ns == 10
    assert ev("add", 10, 7).gpu_end_ns == 507
    assert e.gpu_end_ns is None


# ---- life cycle ---------------------------------------------------------------


def test_empty_profile_gives_empty_table():
    with profile() as prof:
        pass
    assert prof.events() == []
    rows = prof.key_averages()
    assert len(rows) == 0
    table = rows.table()
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["Name", "Calls"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2:] == ["(no events recorded)"]
    assert prof.start_ns is not None and prof.end_ns >= prof.start_ns


def test_nested_profile_raises_and_outer_keeps_recording():
    with profile() as outer:
        with pytest.raises(RuntimeError, match=r"already active: profiles do not nest"):
            with profile():
                pass
        assert _core._profiler_is_enabled()
        with record_function("still recorded"):
            pass
    assert [e.name for e in outer.events()] == ["still recorded"]
    assert not _core._profiler_is_enabled()
    with profile() as again:  # a new one may start once the first ended
        pass
    assert again.events() == []


def test_profile_records_once():
    prof = profile()
    with prof:
        pass
    with pytest.raises(RuntimeError, match=r"records only once"):
        with prof:
            pass


def test_results_need_a_finished_profile(tmp_path):
    prof = profile()
    with pytest.raises(RuntimeError, match=r"^events\(\): the profile has not started"):
        prof.events()
    with prof:
        with pytest.raises(RuntimeError, match=r"^key_averages\(\): the profile has not finished"):
            prof.key_averages()
        with pytest.raises(RuntimeError, match=r"^export_chrome_trace\(\)"):
            prof.export_chrome_trace(tmp_path / "t.json")
    assert prof.events() == []


def test_disable_without_enable_raises():
    with pytest.raises(RuntimeError, match=r"no cudalab.profiler.profile\(\) is recording"):
        _core._profiler_disable()


def test_profile_ends_on_exception():
    with pytest.raises(KeyError):
        with profile() as prof:
            with record_function("before the error"):
                pass
            raise KeyError("boom")
    assert not _core._profiler_is_enabled()
    assert [e.name for e in prof.events()] == ["before the error"]


def test_key_averages_argument_type():
    with profile() as prof:
        pass
    with assert_arg_error(TypeError, "key_averages", "group_by_input_shape",
                          match="^expected a bool"):
        prof.key_averages(group_by_input_shape="yes")  # type: ignore[arg-type]


# ---- record_function ---------------------------------------------------------------


def test_record_function_is_a_host_range():
    with profile() as prof:
        with record_function("outer"):
            with record_function("inner"):
                pass
    events = prof.events()
    assert [e.name for e in events] == ["outer", "inner"]
    outer, inner = events
    for e in events:
        assert e.kind == "range"
        assert e.thread_id == threading.get_native_id()
        assert e.host_end_ns >= e.host_start_ns
        assert e.input_shapes == () and e.dtype is None and e.bytes is None
        assert e.in_graph_capture is False
        if not HAS_GPU:
            assert e.device is None and e.stream is None and e.gpu_duration_ns is None
    assert outer.host_start_ns <= inner.host_start_ns <= inner.host_end_ns <= outer.host_end_ns
    assert prof.start_ns <= outer.host_start_ns and outer.host_end_ns <= prof.end_ns


def test_record_function_as_decorator_and_on_exception():
    @record_function("work")
    def work(x, y=1):
        """docstring kept"""
        return x + y

    assert work.__name__ == "work" and work.__doc__ == "docstring kept"
    with profile() as prof:
        assert work(1, y=2) == 3
        with pytest.raises(ZeroDivisionError):
            with record_function("failing"):
                1 / 0
        assert work(5) == 6
    assert [e.name for e in prof.events()] == ["work", "failing", "work"]


def test_record_function_same_object_reentered():
    rf = record_function("again")
    with profile() as prof:
        with rf:
            with rf:
                pass
    assert [e.name for e in prof.events()] == ["again", "again"]


def test_record_function_outside_a_profile_is_not_recorded():
    with record_function("nobody listens"):
        pass
    with profile() as prof:
        pass
    with record_function("after the profile"):
        pass
    assert prof.events() == []


def test_record_function_left_open_is_dropped():
    rf = record_function("spans the end")
    with profile() as prof:
        rf.__enter__()
    rf.__exit__(None, None, None)  # closing it later is harmless
    assert prof.events() == []


def test_record_function_argument_errors():
    with assert_arg_error(TypeError, "record_function", "name", match="^expected a str"):
        record_function(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"decorates a callable"):
        record_function("x")(42)  # type: ignore[arg-type]
    with assert_arg_error(TypeError, "_profiler_range_begin", "name"):
        _core._profiler_range_begin(b"bytes")
    with assert_arg_error(TypeError, "_profiler_range_end", "token"):
        _core._profiler_range_end("not a token")


def test_record_function_in_another_thread():
    seen = {}

    def worker():
        seen["tid"] = threading.get_native_id()
        with record_function("in a thread"):
            pass

    with profile() as prof:
        t = threading.Thread(target=worker, name="profiled-worker")
        t.start()
        t.join()
    (e,) = prof.events()
    assert e.name == "in a thread" and e.thread_id == seen["tid"]
    assert e.thread_id != threading.get_native_id()


def test_nvtx_switch_round_trips():
    before = _core._nvtx_is_enabled()
    try:
        assert _core._nvtx_set_enabled(True) is before
        assert _core._nvtx_is_enabled() is True
        token = _core._profiler_range_begin("nvtx only")
        assert token is not None and token[2] is True  # an NVTX range, no record
        _core._profiler_range_end(token)
        with profile() as prof:
            with record_function("both"):
                pass
        assert [e.name for e in prof.events()] == ["both"]
        assert _core._nvtx_set_enabled(False) is True
        assert _core._profiler_range_begin("nothing") is None
    finally:
        _core._nvtx_set_enabled(before)


# A stand-in NVTX tool: logs the cudalab domain's pushes and pops to stderr.
NVTX_TOOL_C = r'''
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
static int depth;
static nvtxDomainHandle_t create(const char *name)
{
    fprintf(stderr, "domain %s\n", name);
    return (nvtxDomainHandle_t)0x1;
}
static int push(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
    fprintf(stderr, "push %s\n", a->message.ascii);
    return ++depth;
}
static int pop(nvtxDomainHandle_t d)
{
    fprintf(stderr, "pop\n");
    return depth--;
}
int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get)
{
    const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table;
    unsigned size;
    if (cb == 0 || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size)) {
        return 0;
    }
    *table[NVTX_CBID_CORE2_DomainCreateA] = (NvtxFunctionPointer)create;
    *table[NVTX_CBID_CORE2_DomainRangePushEx] = (NvtxFunctionPointer)push;
    *table[NVTX_CBID_CORE2_DomainRangePop] = (NvtxFunctionPointer)pop;
    return 1;
}
'''


def _cuda_include() -> Path | None:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.insert(0, str(Path(nvcc).resolve().parent.parent))
    for root in filter(None, roots):
        if (Path(root) / "include" / "nvtx3" / "nvToolsExt.h").exists():
            return Path(root) / "include"
    return None


def test_nvtx_ranges_reach_an_attached_tool(tmp_path):
    """With NVTX_INJECTION64_PATH set (as Nsight Systems sets it), ranges are
    pushed and popped, balanced, in the cudalab domain."""
    cc = shutil.which("cc") or shutil.which("gcc")
    include = _cuda_include()
    if cc is None or include is None or not sys.platform.startswith("linux"):
        pytest.skip("needs a C compiler and the CUDA toolkit's NVTX headers")
    (tmp_path / "tool.c").write_text(NVTX_TOOL_C)
    lib = tmp_path / "libtool.so"
    subprocess.run([cc, "-shared", "-fPIC", f"-I{include}", str(tmp_path / "tool.c"), "-o",
                    str(lib)], check=True, capture_output=True)
    script = (
        "from cudalab import _core, profiler\n"
        "assert _core._nvtx_is_enabled()\n"
        "with profiler.record_function('outer'):\n"
        "    with profiler.record_function('inner'):\n"
        "        pass\n"
        "with profiler.profile() as p:\n"
        "    with profiler.record_function('recorded'):\n"
        "        pass\n"
        "assert [e.name for e in p.events()] == ['recorded']\n"
    )
    env = dict(os.environ, NVTX_INJECTION64_PATH=str(lib))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = [line for line in done.stderr.splitlines()
           if line.split(" ")[0] in ("domain", "push", "pop")]
    assert log == ["domain cudalab", "push outer", "push inner", "pop", "pop", "push recorded",
                   "pop"]


def test_nvtx_off_without_a_tool():
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTX_INJECTION")}
    done = subprocess.run(
        [sys.executable, "-c", "from cudalab import _core; print(_core._nvtx_is_enabled())"],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# ---- key averages and the table ---------------------------------------------------------


def synthetic_profile():
    events = [
        ev("matmul", 30_000, 2_000_000, start=0, shapes=((64, 64), (64, 64)),
           nbytes=3 * 64 * 64 * 4, flops=2 * 64**3),
        ev("add", 5_000, 10_000, start=40_000, shapes=((64, 64), (64, 64)),
           nbytes=3 * 64 * 64 * 4, flops=64 * 64),
        ev("add", 7_000, 30_000, start=50_000, shapes=((8,), (8,)), nbytes=96, flops=8),
        ev("sum", 4_000, 20_000, start=60_000, shapes=((64, 64),), nbytes=64 * 64 * 4 + 4),
        ev("get", 50_000, None, start=70_000, shapes=((64,),)),  # no GPU time
        ev("step", 200_000, 2_100_000, kind="range", start=0, shapes=(), dtype=None),
    ]
    return Profile.from_events(events, start_ns=0, end_ns=300_000), events


def test_key_averages_sums_per_name():
    prof, _ = synthetic_profile()
    rows = {(r.kind, r.name): r for r in prof.key_averages()}
    add = rows[("op", "add")]
    assert add.calls == 2 and add.gpu_calls == 2
    assert add.host_time_total_ns == 12_000 and add.host_time_avg_ns == 6_000
    assert add.gpu_time_total_ns == 40_000 and add.gpu_time_avg_ns == 20_000
    assert add.bytes == 3 * 64 * 64 * 4 + 96
    assert add.gb_per_s == pytest.approx((3 * 64 * 64 * 4 + 96) / 40e-6 / 1e9)
    assert add.tflop_per_s == pytest.approx((64 * 64 + 8) / 40e-6 / 1e12)
    assert add.input_shapes is None
    get = rows[("op", "get")]
    assert get.gpu_time_total_ns is None and get.gpu_time_avg_ns is None
    assert get.gb_per_s is None and get.tflop_per_s is None and get.bytes is None
    assert rows[("op", "sum")].flops is None
    assert rows[("range", "step")].calls == 1


def test_key_averages_by_input_shape():
    prof, _ = synthetic_profile()
    rows = [r for r in prof.key_averages(group_by_input_shape=True) if r.name == "add"]
    assert [r.input_shapes for r in rows] == [((64, 64), (64, 64)), ((8,), (8,))]
    assert [r.calls for r in rows] == [1, 1]
    table = prof.key_averages(group_by_input_shape=True).table(sort_by="name")
    assert "Input shapes" in table.splitlines()[0]
    assert "[(64, 64), (64, 64)]" in table and "[(8,), (8,)]" in table


def table_names(table):
    lines = table.splitlines()[2:]
    return [line.split()[0] for line in lines if line and not line[0].isdigit()
            and not line.startswith("(")]


@pytest.mark.parametrize(
    "sort_by, expected",
    [
        ("gpu_time_total", ["step", "matmul", "add", "sum", "get"]),
        ("gpu_time_avg", ["step", "matmul", "add", "sum", "get"]),
        ("host_time_total", ["step", "get", "matmul", "add", "sum"]),
        ("host_time_avg", ["step", "get", "matmul", "add", "sum"]),
        ("name", ["add", "get", "matmul", "step", "sum"]),
    ],
)
def test_table_sorting(sort_by, expected):
    prof, _ = synthetic_profile()
    assert table_names(prof.key_averages().table(sort_by=sort_by)) == expected


@pytest.mark.parametrize("torch_key, ours", [
    ("cuda_time_total", "gpu_time_total"),
    ("self_cuda_time_total", "gpu_time_total"),
    ("device_time_total", "gpu_time_total"),
    ("self_device_time_total", "gpu_time_total"),
    ("cuda_time", "gpu_time_avg"),
    ("device_time", "gpu_time_avg"),
    ("cpu_time_total", "host_time_total"),
    ("self_cpu_time_total", "host_time_total"),
    ("cpu_time", "host_time_avg"),
    ("count", "calls"),
])
def test_table_takes_torchs_sort_keys(torch_key, ours):
    """The guides type torch's names (sort_by="cuda_time_total"): each sorts as cudalab's key."""
    assert profiler.TORCH_SORT_KEYS[torch_key] == ours
    rows = synthetic_profile()[0].key_averages()
    assert rows.sorted(torch_key) == rows.sorted(ours)
    assert rows.table(sort_by=torch_key, row_limit=3) == rows.table(sort_by=ours, row_limit=3)


def test_torch_sort_keys_name_only_cudalab_keys():
    assert set(profiler.TORCH_SORT_KEYS.values()) <= set(profiler.SORT_KEYS)
    assert not set(profiler.TORCH_SORT_KEYS) & set(profiler.SORT_KEYS)
    assert "TORCH_SORT_KEYS" in profiler.__all__


def test_an_unknown_sort_key_lists_cudalabs_keys_and_torchs():
    rows = synthetic_profile()[0].key_averages()
    with assert_arg_error(ValueError, "table", "sort_by", match="^unknown key 'bogus'") as info:
        rows.table(sort_by="bogus")
    message = str(info.value)
    for key in profiler.SORT_KEYS:
        assert key in message
    assert "torch's name for one: cuda_time_total (gpu_time_total), " in message
    for key in profiler.TORCH_SORT_KEYS:
        assert key in message


@pytest.mark.parametrize("key", ["cuda_memory_usage", "self_cpu_memory_usage"])
def test_torchs_memory_sort_keys_say_no_memory_is_recorded(key):
    rows = synthetic_profile()[0].key_averages()
    with assert_arg_error(ValueError, "table", "sort_by",
                          match=f"^torch's key '{key}' sorts by memory, which cudalab's "
                                "profiler does not record") as info:
        rows.table(sort_by=key)
    assert "gpu_time_total" in str(info.value) and "cuda_time_total" in str(info.value)


def test_table_sort_by_calls_puts_most_called_first():
    prof, _ = synthetic_profile()
    assert table_names(prof.key_averages().table(sort_by="calls"))[0] == "add"


def test_table_columns_and_values():
    prof, _ = synthetic_profile()
    table = prof.key_averages().table()
    lines = table.splitlines()
    assert lines[0].split("  ")[0].strip() == "Name"
    for column in ("Calls", "Host total", "Host avg", "GPU total", "GPU avg", "GPU %", "GB/s",
                   "TFLOP/s"):
        assert column in lines[0]
    by_name = {line.split()[0]: line for line in lines[2:]}
    assert "2.00 ms" in by_name["matmul"] and "30.00 us" in by_name["matmul"]
    # GPU % is the share of all ops' GPU time (2.06 ms): matmul 97.1 %
    assert "97.1" in by_name["matmul"]
    assert by_name["get"].split()[-5:] == ["-", "-", "-", "-", "-"]
    assert lines[-1].startswith("5 op calls, 1 range; GPU time of all ops: 2.06 ms")


def test_table_row_limit():
    prof, _ = synthetic_profile()
    table = prof.key_averages().table(row_limit=2)
    assert table_names(table) == ["step", "matmul"]
    assert table.splitlines()[-1].endswith("3 more rows not shown")
    assert table_names(prof.key_averages().table(row_limit=0)) == []
    assert len(table_names(prof.key_averages().table(row_limit=100))) == 5


def test_table_argument_errors():
    rows, _ = synthetic_profile()
    rows = rows.key_averages()
    with assert_arg_error(ValueError, "table", "sort_by", match="^unknown key 'gpu_time'"):
        rows.table(sort_by="gpu_time")
    with assert_arg_error(TypeError, "table", "sort_by", match="^expected a str"):
        rows.table(sort_by=1)  # type: ignore[arg-type]
    with assert_arg_error(ValueError, "table", "row_limit", match="^must be >= 0"):
        rows.table(row_limit=-1)
    with assert_arg_error(TypeError, "table", "row_limit"):
        rows.table(row_limit=2.0)  # type: ignore[arg-type]
    with assert_arg_error(TypeError, "table", "row_limit"):
        rows.table(row_limit=True)


def test_long_names_are_clipped():
    rows = KeyAverages.from_events([ev("x" * 100, 10)])
    first_row = rows.table().splitlines()[2]
    assert first_row.startswith("x" * 37 + "...")


@pytest.mark.parametrize(
    "ns, text",
    [(None, "-"), (0, "0 ns"), (999, "999 ns"), (1_000, "1.00 us"), (1_500_000, "1.50 ms"),
     (2_000_000_000, "2.00 s")],
)
def test_format_time(ns, text):
    assert format_time_ns(ns) == text


# ---- Chrome trace --------------------------------------------------------------------


def test_chrome_trace_from_synthetic_events(tmp_path):
    prof, events = synthetic_profile()
    side = ev("mul", 1_000, 2_000, start=80_000, stream=0x7F00, thread_id=2)
    prof = Profile.from_events(events + [side], start_ns=0)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    trace = doc["traceEvents"]
    assert isinstance(trace, list) and trace
    for e in trace:
        assert {"name", "ph", "pid", "tid"} <= set(e)
        assert e["ph"] in {"X", "M"}
    complete = [e for e in trace if e["ph"] == "X"]
    for e in complete:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
    host = [e for e in complete if e["pid"] == os.getpid()]
    gpu = [e for e in complete if e["pid"] != os.getpid()]
    assert len(host) == len(events) + 1  # every event on the host
    assert len(gpu) == 6  # those with a GPU time
    meta = [e for e in trace if e["ph"] == "M"]
    names = {(e["pid"], e["name"], e["args"].get("name")) for e in meta}
    gpu_pid = gpu[0]["pid"]
    assert (gpu_pid, "process_name", "GPU 0") in names
    assert (gpu_pid, "thread_name", "legacy default stream") in names
    assert (gpu_pid, "thread_name", "stream 0x7f00") in names
    assert {e["tid"] for e in gpu} == {0, 1}  # one track per stream
    assert {e["tid"] for e in host} == {1, 2}  # one track per thread
    matmul = next(e for e in host if e["name"] == "matmul")
    assert matmul["ts"] == 0 and matmul["dur"] == 30.0  # microseconds since start_ns
    assert matmul["cat"] == "op"
    assert matmul["args"]["input_shapes"] == [[64, 64], [64, 64]]
    assert matmul["args"]["flops"] == 2 * 64**3 and matmul["args"]["dtype"] == "float32"
    gpu_matmul = next(e for e in gpu if e["name"] == "matmul")
    assert gpu_matmul["ts"] == 0.5 and gpu_matmul["dur"] == 2000.0
    assert gpu_matmul["cat"] == "gpu_op"
    step = next(e for e in host if e["name"] == "step")
    assert step["cat"] == "range"


def test_chrome_trace_of_nothing_is_valid():
    doc = chrome_trace([])
    assert doc["displayTimeUnit"] == "ms"
    assert all(e["ph"] == "M" for e in doc["traceEvents"])
    json.dumps(doc)


def test_chrome_trace_of_a_real_profile(tmp_path):
    with profile() as prof:
        with record_function("host range"):
            pass
    path = tmp_path / "real.json"
    prof.export_chrome_trace(path)
    doc = json.loads(path.read_text())
    (x,) = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == os.getpid()]
    assert x["name"] == "host range" and x["ts"] >= 0
    thread_names = [e["args"]["name"] for e in doc["traceEvents"]
                    if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == os.getpid()]
    assert thread_names == [threading.current_thread().name]
    assert doc["otherData"]["producer"] == "cudalab.profiler"
