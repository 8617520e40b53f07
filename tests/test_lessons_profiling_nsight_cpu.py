"""CPU tier: lesson 8 `profiling`'s Nsight part without a GPU or Nsight.

The finding on which tools are on the PATH, the parser of `nsys stats` CSV, the
`nsys` parameter, and the optional run under nsys with a stand-in process.
"""

from __future__ import annotations

import subprocess

import pytest

from cudalab import lessons
from cudalab.lessons import profiling

# `nsys stats --report cuda_gpu_kern_sum --format csv --output -`: lines before the table.
STATS = """\
Generating SQLite file /tmp/x/tiny_step.sqlite from /tmp/x/tiny_step.nsys-rep
Processing [/tmp/x/tiny_step.sqlite] with [cuda_gpu_kern_sum.py]...
"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
61.5,12345,9,1371.7,1300.0,1200,1700,150.2,"cublasLt_gemm_kernel<float>"
38.5,7730,6,1288.3,1250.0,1100,1500,120.0,"adamw_multi_tensor"
"""


def _params(**over):
    return {**lessons.get("profiling").defaults(True), **over}


def test_nsys_param_off_by_default_and_checked():
    assert lessons.get("profiling").params["nsys"] is False
    profiling.check_params(_params(nsys=True))
    with pytest.raises(ValueError, match=r"^lesson 'profiling': nsys must be True or False"):
        profiling.check_params(_params(nsys=1))


def test_nsight_text_names_the_tools_found_and_the_commands():
    both = profiling.nsight_text({"nsys": "/opt/nsys", "ncu": "/opt/ncu"})
    assert both.startswith("Nsight: nsys at /opt/nsys, ncu at /opt/ncu found. Run the timeline")
    assert profiling.NSYS_COMMAND in both and profiling.NCU_COMMAND in both
    assert "'cudalab' domain" in both and "'train step'" in both
    none = profiling.nsight_text({"nsys": None, "ncu": None})
    assert none.startswith("Nsight: neither nsys nor ncu is on the PATH. With Nsight installed")
    assert profiling.nsight_text({"nsys": None, "ncu": "/x/ncu"}).startswith(
        "Nsight: ncu at /x/ncu found.")
    assert profiling.NSYS_COMMAND.startswith("nsys profile -t cuda,nvtx -o ")
    assert profiling.NSYS_COMMAND.endswith("python -m cudalab lesson profiling --quick")


def test_kernel_summary_reads_the_stats_table():
    assert profiling.kernel_summary(STATS) == (2, 15, 12345.0 + 7730.0)
    assert profiling.kernel_summary("") is None
    assert profiling.kernel_summary("SKIPPED: no kernel data\n") is None
    header = STATS.splitlines()[2]
    assert profiling.kernel_summary(header + "\n") is None  # a header without rows
    assert profiling.kernel_summary(header + "\n1,x,2,3,3,3,3,0,k\n") is None


def test_the_tiny_nsys_script_compiles():
    compile(profiling.NSYS_SCRIPT, "tiny_step.py", "exec")
    assert "record_function(\"train step\")" in profiling.NSYS_SCRIPT


class _Run:
    def __init__(self, **params):
        self.params = params
        self.findings = []

    def finding(self, text, value=None, unit=None, labels=()):
        self.findings.append(text)


def test_nsight_without_nsys_runs_nothing(monkeypatch):
    monkeypatch.setattr(profiling.shutil, "which", lambda name: None)
    monkeypatch.setattr(profiling.subprocess, "run", lambda *a, **k: pytest.fail("ran"))
    r = _Run(nsys=False)
    profiling._nsight(r)
    assert len(r.findings) == 1 and "neither nsys nor ncu" in r.findings[0]
    r = _Run(nsys=True)
    profiling._nsight(r)
    assert r.findings[1] == "nsys=True but nsys is not on the PATH: nothing was run under it"


def test_nsight_found_but_not_asked_runs_nothing(monkeypatch):
    monkeypatch.setattr(profiling.shutil, "which", lambda name: "/opt/" + name)
    monkeypatch.setattr(profiling.subprocess, "run", lambda *a, **k: pytest.fail("ran"))
    r = _Run(nsys=False)
    profiling._nsight(r)
    assert len(r.findings) == 1


def test_nsys_run_reports_the_kernels(monkeypatch):
    runs = []

    def fake_run(args, **kwargs):
        runs.append(args)
        if args[1] == "stats" and args[3] == "cuda_gpu_kern_sum":
            raise subprocess.CalledProcessError(1, args)  # an older nsys: the old name
        out = STATS if args[1] == "stats" else ""
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(profiling.shutil, "which", lambda name: "/opt/" + name)
    monkeypatch.setattr(profiling.subprocess, "run", fake_run)
    r = _Run(nsys=True)
    profiling._nsight(r)
    assert [a[:2] for a in runs] == [["/opt/nsys", "profile"], ["/opt/nsys", "stats"],
                                     ["/opt/nsys", "stats"]]
    assert runs[0][2:4] == ["-t", "cuda,nvtx"] and runs[0][-1].endswith("tiny_step.py")
    assert "ran 15 kernels (2 distinct) for 20.1 us of GPU time" in r.findings[1]
    assert "--report gpukernsum" in r.findings[1]


def test_nsys_failures_are_findings(monkeypatch):
    def timeout(args, **kwargs):
        raise subprocess.TimeoutExpired(args, kwargs["timeout"])

    monkeypatch.setattr(profiling.subprocess, "run", timeout)
    assert profiling._run_nsys("/opt/nsys").startswith(
        "nsys profile of a tiny training step failed (TimeoutExpired")
    monkeypatch.setattr(profiling.subprocess, "run",
                        lambda args, **k: subprocess.CompletedProcess(args, 0, "nothing", ""))
    assert "gave no kernel table" in profiling._run_nsys("/opt/nsys")
