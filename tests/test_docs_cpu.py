"""CPU tier: README.md and docs/*.md stay true to the repository.

- every relative link points to a file or directory that exists, and every
  ``#anchor`` to a heading of its page;
- every shell command in a ```bash block is accounted for in the tables below:
  run here (CPU tier), run by a named CPU or GPU test (whose source must show
  the command's words), run by CI (.ci/run), or not run, with the reason. A
  command in the docs that no table lists fails, and so does a listed command
  no page shows any more;
- every number of the README's "Beside PyTorch" table appears in the page its
  row links to, where the full table and its results file are named.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from _support import DOCS, README, REPO_ROOT

PAGES = [README, *sorted(DOCS.glob("*.md"))]

# ---- how each command is tested -----------------------------------------------------------------

# Commands this file runs (in the CPU tier), with their expected exit status; `python` is this
# interpreter, `cudalab` is `python -m cudalab` (what the console script runs).
RUN_HERE = {
    "cudalab lessons --params": 0,
    "python scripts/build_notebooks.py --check": 0,
    "python scripts/lessons_summary.py benchmarks/results/lessons_NVIDIA_H100_80GB_HBM3.json": 0,
    "scripts/sanitize.sh -p list": 0,
    "cudalab results dtypes": 0,
}

# Commands .ci/run runs: the README's block between the ci:begin and ci:end markers.
CI = ("python -m pip install \".[test,models]\"", "python -m pytest")

# Commands a named test runs (the same command, or the same subcommand and options on smaller
# inputs): command -> (test, words the test's source must contain). GPU tests are marked `gpu`.
IN_TESTS = {
    "python -m cudalab check":
        ("tests/test_cli.py::test_check_reports_every_device", ['"check"']),
    "python -m cudalab bench matmul --dtype float16":
        ("tests/test_cli_bench.py::test_bench_matmul_prints_and_writes_json",
         ['"bench"', '"matmul"', '"--dtype"', "float16"]),
    "python -m cudalab lesson dtypes --quick":  # the same command on the first lesson
        ("tests/test_cli_lessons_gpu.py::test_lesson_quick_writes_a_file_read_results_reads_back",
         ['"lesson"', '"--quick"']),
    "cudalab lesson NAME --quick":
        ("tests/test_cli_lessons_gpu.py::test_lesson_quick_writes_a_file_read_results_reads_back",
         ['"lesson"', '"--quick"']),
    "cudalab lesson NAME --set sizes=1024,2048 --set dtype=float16":
        ("tests/test_cli_lessons_gpu.py::test_set_overrides_a_parameter", ['"lesson"', '"--set"']),
    "cudalab cpu-vs-gpu --matrix-size 8192 --iterations 100":
        ("tests/test_cli_lessons_gpu.py::test_cpu_vs_gpu_passes_its_options",
         ['"cpu-vs-gpu"', '"--matrix-size"', '"--iterations"']),
    "cudalab memory --batch-sizes 16,32,64,128":
        ("tests/test_cli_lessons_gpu.py::test_memory_passes_its_batch_sizes",
         ['"memory"', '"--batch-sizes"']),
    "cudalab inference --model-name resnet50 --batch-sizes 1,8,16,32":  # parsed, not run
        ("tests/test_cli_guide.py::test_model_name_is_the_model_option_as_the_guide_spells_it",
         ['"inference"', '"--model-name"', '"--batch-sizes"']),
    "cudalab guide --quick":  # CPU tier, with stand-in lessons
        ("tests/test_cli_guide.py::test_quick_runs_each_lesson_quick", ['"guide"', '"--quick"']),
    # CPU tier, with stand-in lessons (a real run-all takes minutes on a GPU).
    "cudalab run-all --quick --json lessons.json --markdown lessons.md":
        ("tests/test_cli_lessons.py::test_run_all_runs_every_lesson_in_order_and_carries_on",
         ['"run-all"', '"--json"', '"--markdown"']),
    "python scripts/build_notebooks.py":
        ("tests/test_notebooks_cpu.py::test_build_writes_every_notebook", ["build.build("]),
    "python -m pytest tests/test_plugin_example_gpu.py --gpu-benchmark-json base.json":
        ("tests/test_pytest_plugin_gpu.py::test_json_then_compare_against_tampered_and_true_baselines",
         ['"--gpu-benchmark-json"']),
    "python -m pytest tests/test_plugin_example_gpu.py --gpu-benchmark-compare base.json "
    "--gpu-benchmark-compare-fail 10%":
        ("tests/test_pytest_plugin_gpu.py::test_json_then_compare_against_tampered_and_true_baselines",
         ['"--gpu-benchmark-compare"', '"--gpu-benchmark-compare-fail"']),
}

# Commands no test runs, and why.
NOT_RUN = {
    "python -m pip install \".[notebooks]\"":
        "installs JupyterLab and its dependencies from the network; tests/test_notebooks_gpu.py "
        "executes every notebook where nbclient is installed",
    "jupyter lab notebooks/": "starts an interactive server",
    "python -m pip install scikit-build-core numpy cmake ninja \"nvidia-cutlass==4.2.0.0\"":
        "a developer's setup from the network; CI installs the same build requirements through "
        "the README's install command",
    "python -m pip install --no-build-isolation -e \".[test]\" -C editable.rebuild=true "
    "-C build-dir=build/{wheel_tag} -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90":
        "a developer's build (minutes, needs nvcc); CI builds with the README's install command",
    "CUDALAB_REQUIRE_GPU=1 python -m pytest":
        "the GPU tier itself: needs a GPU (scripts/gpu_check.sh runs it on a GPU machine)",
    "scripts/gpu_check.sh":
        "needs a GPU: builds, runs the whole GPU tier and memcheck, writes benchmarks/results/",
    "scripts/sanitize.sh -t memcheck -p ops,nn,training,models":
        "needs a GPU and compute-sanitizer (tests/test_sanitize_cpu.py checks its bookkeeping)",
    "scripts/run_benchmarks.sh": "needs a GPU: writes benchmarks/results/compute_<device>.json",
    "scripts/run_notebooks.sh --quick":
        "needs a GPU and Jupyter; tests/test_notebooks_gpu.py executes every notebook in quick "
        "mode through the same code (build_notebooks.execute)",
}


def _strip_code(text: str) -> str:
    """`text` without fenced blocks and inline code spans (links in them are not links)."""
    text = re.sub(r"^(`{3,})[^\n]*\n.*?^\1[ \t]*$", "", text, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"`[^`\n]*`", "", text)


def bash_commands(path: Path) -> list[str]:
    """The shell commands of `path`'s ```bash blocks: continuation lines joined, comments and
    repeated spaces dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", path.read_text(), flags=re.DOTALL | re.MULTILINE):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                commands.append(" ".join(line.split()))
    return commands


def _all_commands() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for command in bash_commands(page):
            found.setdefault(command, []).append(page.relative_to(REPO_ROOT).as_posix())
    return found


def test_every_command_is_tested_or_says_why_not():
    tables = [set(RUN_HERE), set(CI), set(IN_TESTS), set(NOT_RUN)]
    assert sum(map(len, tables)) == len(set().union(*tables)), "a command is in two tables"
    listed = set().union(*tables)
    found = _all_commands()
    untested = {c: pages for c, pages in found.items() if c not in listed}
    assert not untested, ("commands shown in the docs that no table of tests/test_docs_cpu.py "
                          f"accounts for (run one, or say why not): {untested}")
    stale = listed - set(found)
    assert not stale, f"listed commands that no page shows any more: {sorted(stale)}"


def test_ci_runs_the_readme_block_it_is_listed_for():
    text = README.read_text()
    block = text.split("<!-- ci:begin -->", 1)[1].split("<!-- ci:end -->", 1)[0]
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("```")]
    assert tuple(commands) == CI
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "<!-- ci:begin -->" in ci and "<!-- ci:end -->" in ci and 'eval "$cmd"' in ci


def _function_source(nodeid: str) -> str:
    path, name = nodeid.split("::")
    source = (REPO_ROOT / path).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node) or ""
    raise AssertionError(f"{nodeid} does not exist")


@pytest.mark.parametrize("command", sorted(IN_TESTS))
def test_the_named_test_runs_the_command(command):
    nodeid, words = IN_TESTS[command]
    source = _function_source(nodeid)
    missing = [w for w in words if w not in source]
    assert not missing, f"{nodeid} does not show {missing} of `{command}`"


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    if argv[0] == "cudalab":
        return [sys.executable, "-m", "cudalab", *argv[1:]]
    if argv[0].endswith(".sh"):
        return ["bash", *argv]
    raise AssertionError(f"do not know how to run {command}")


@pytest.mark.parametrize("command", sorted(RUN_HERE))
def test_command_runs_here(command):
    done = subprocess.run(_argv(command), cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == RUN_HERE[command], done.stderr[-2000:]
    if "lessons_summary.py" in command:
        assert done.stdout.strip() in README.read_text(), "the README's table is its output"
    elif "build_notebooks.py --check" in command:
        assert "up to date" in done.stdout
    elif "lessons --params" in command:
        assert "context" in done.stdout and "pipeline_parallel" in done.stdout
    elif "-p list" in command:
        assert "ops:" in done.stdout and "tests/test_matmul_gpu.py" in done.stdout
    elif "results dtypes" in command:
        assert "Lesson 2 `dtypes`" in done.stdout, done.stdout[:500]


# ---- links --------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6}\s+(.*?)\s*#*$", _strip_code(path.read_text()), re.MULTILINE):
        base = slug(match.group(1).replace("`", ""))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", _strip_code(path.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_point_to_what_exists(page):
    broken = []
    for target in _links(page):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: {broken}"


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in _links(README)}
    assert {p.resolve() for p in DOCS.glob("*.md")} <= linked


# ---- the README's headline figures --------------------------------------------------------------


def test_readme_headline_figures_are_those_of_the_linked_pages():
    section = README.read_text().split("## Beside PyTorch", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "](" in line]
    assert len(rows) >= 8
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        target = re.search(r"\]\(([^)#]+)", cells[-1]).group(1)
        page = (README.parent / target).read_text()
        for cell in cells[:-1]:
            for number in re.findall(r"\d[\d,]*(?:\.\d+)?", cell):
                assert number.rstrip(",") in page, f"{number} ({row[:60]}...) is not in {target}"
