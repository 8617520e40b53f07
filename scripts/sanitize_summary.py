"""Record and tabulate compute-sanitizer runs of the GPU tier (scripts/sanitize.sh).

    sanitize_summary.py record --tool T --part P --pass main|deliberate --logs DIR --tag TAG
                               --rc N --seconds S --command CMD [--options OPTS]
    sanitize_summary.py table
    sanitize_summary.py probe --log FILE

`record` reads the per-process sanitizer logs DIR/TAG.<pid>.log and pytest's
JUnit file DIR/TAG.junit.xml, and stores one entry under "T/P/pass" in
benchmarks/results/sanitizer_<device>.json, replacing an older entry of the
same run and keeping every other: the tier is too slow under four tools for
one session, so the file gathers the parts as sessions run them. `table`
writes sanitizer_<device>.md (tools x parts) from that file. `probe` stores
what memcheck said of scripts/sanitizer_graph_alias.cu (graph allocations
sharing an address), the reason sanitize.sh keeps graph temporaries.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_summary import junit_counts  # noqa: E402  (a sibling script)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")

# "========= ERROR SUMMARY: 3 errors" ends each process's log; racecheck also
# prints "RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)".
# (A second line, "N errors were not printed", follows when the print limit
# was reached: the pattern must not count it.)
ERROR_SUMMARY = re.compile(r"^=+ ERROR SUMMARY: (\d+) errors?\s*$", re.M)
# The first line of a report: what went wrong ...
REPORT = re.compile(
    r"^=+ (Invalid .*|Program hit .*|Malformed .*|Uninitialized .*|Error: .*|"
    r"(?:Warning|Error): Race .*|Barrier error.*|.*[Hh]azard.*detected.*|Leaked .*)$", re.M)
# ... and the function it happened in.
WHERE = re.compile(r"^=+\s+at (?:0x[0-9a-f]+ in )?([^\n]+)$", re.M)


@functools.lru_cache(maxsize=None)
def device_tag() -> str:
    """The device's name with underscores (SANITIZE_DEVICE overrides: for `table` off the GPU)."""
    if os.environ.get("SANITIZE_DEVICE"):
        return os.environ["SANITIZE_DEVICE"].replace(" ", "_")
    import cudalab

    return cudalab.get_device_properties(0).name.replace(" ", "_")


def results_path(suffix: str) -> Path:
    return RESULTS / f"sanitizer_{device_tag()}.{suffix}"


def sanitizer_version() -> str:
    try:
        out = subprocess.run(["compute-sanitizer", "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    found = re.search(r"Version (\S+)", out)
    return found.group(1) if found else out.strip().splitlines()[-1] if out.strip() else "unknown"


def git_commit() -> str:
    """HEAD, or SANITIZE_COMMIT when set (a copied tree may carry an older .git)."""
    if os.environ.get("SANITIZE_COMMIT"):
        return os.environ["SANITIZE_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=ROOT, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=ROOT, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def read_logs(logs: Path, tag: str) -> dict:
    """Errors summed over every process's log, and the distinct reports."""
    errors, processes, reports = 0, 0, {}
    for log in sorted(logs.glob(f"{tag}.*.log")):
        if log.name.endswith(".pytest.log"):
            continue
        text = log.read_text(errors="replace")
        counts = [int(n) for n in ERROR_SUMMARY.findall(text)]
        if not counts:
            continue  # a process that never touched CUDA
        processes += 1
        errors += sum(counts)
        for match in REPORT.finditer(text):
            where = WHERE.search(text, match.end())
            key = match.group(1).strip()
            if where is not None and where.start() - match.end() < 400:
                key += " @ " + where.group(1).strip()[:160]
            reports[key] = reports.get(key, 0) + 1
    top = sorted(reports.items(), key=lambda kv: -kv[1])[:12]
    return {"errors": errors, "processes": processes,
            "reports": [{"report": k, "count": n} for k, n in top]}


def load() -> dict:
    path = results_path("json")
    if path.exists():
        return json.loads(path.read_text())
    return {"schema": "cudalab.sanitizer/1", "device": device_tag().replace("_", " "),
            "runs": {}}


def record(args: argparse.Namespace) -> int:
    data = load()
    junit = Path(args.logs) / f"{args.tag}.junit.xml"
    entry = {
        "tool": args.tool, "part": args.part, "pass": args.pass_,
        "seconds": args.seconds, "pytest_rc": args.rc,
        "tests": junit_counts(junit) if junit.exists() else {},
        **read_logs(Path(args.logs), args.tag),
        "options": args.options, "command": args.command,
        "commit": git_commit(), "sanitizer": sanitizer_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    data["runs"][f"{args.tool}/{args.part}/{args.pass_}"] = entry
    RESULTS.mkdir(parents=True, exist_ok=True)
    results_path("json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    t = entry["tests"]
    print(f"{args.tool}/{args.part}/{args.pass_}: {entry['errors']} errors in "
          f"{entry['processes']} processes, {args.seconds} s, tests {t.get('passed', '?')} "
          f"passed {t.get('failures', 0) + t.get('errors', 0)} failed")
    for r in entry["reports"]:
        print(f"  {r['count']:5d} x {r['report']}")
    return 1 if entry["errors"] or args.rc != 0 else 0


def probe(args: argparse.Namespace) -> None:
    text = Path(args.log).read_text(errors="replace")
    same = re.search(r"same_address=(\d)", text)
    errors = [int(n) for n in ERROR_SUMMARY.findall(text)]
    data = load()
    data["graph_alias_probe"] = {
        "same_address": bool(int(same.group(1))) if same else None,
        "memcheck_errors": sum(errors) if errors else None,
        "misreported": bool(same and int(same.group(1)) and errors and sum(errors) > 0),
        "sanitizer": sanitizer_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    results_path("json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"graph_alias probe: {data['graph_alias_probe']}")


def cell(runs: list[dict]) -> str:
    if not runs:
        return "not run"
    stopped = [r for r in runs if r["pytest_rc"] == 124]
    if stopped:  # its logs and JUnit file are incomplete: no count is trustworthy
        return f"stopped by the time limit after {sum(r['seconds'] for r in stopped)} s"
    errors = sum(r["errors"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    passed = sum(r["tests"].get("passed", 0) for r in runs)
    failed = sum(r["tests"].get("failures", 0) + r["tests"].get("errors", 0) for r in runs)
    text = f"**{errors}** errors, {seconds} s, {passed} passed"
    return text + (f", {failed} failed" if failed else "")


def table(_: argparse.Namespace) -> None:
    data = load()
    runs = list(data["runs"].values())
    parts = list(dict.fromkeys(r["part"] for r in sorted(runs, key=lambda r: r["date"])))
    lines = [f"# compute-sanitizer over the GPU tier: {data['device']}", "",
             "Written by `scripts/sanitize_summary.py table` from "
             f"`{results_path('json').name}`; each cell sums a part's passes (the main pass and, "
             "where a part has tests that fail a CUDA call on purpose, their own pass with "
             "`--report-api-errors no`; scripts/sanitize.sh lists them and why). sanitize.sh also "
             "leaves out two graph tests under memcheck (MEMCHECK_MISJUDGED) and one timing test "
             "under every tool (SANITIZER_TIMING), saying why. A part's tests run in one "
             "process: a kernel memcheck stops makes the rest of that process fail, so the "
             "first report is the one to read.", "",
             "| part | " + " | ".join(TOOLS) + " |", "|---|" + "---|" * len(TOOLS)]
    for part in parts:
        row = [cell([r for r in runs if r["part"] == part and r["tool"] == t]) for t in TOOLS]
        lines.append(f"| {part} | " + " | ".join(row) + " |")
    alias = data.get("graph_alias_probe")
    if alias is not None:
        lines += ["", "Graph allocations that share an address (scripts/sanitizer_graph_alias.cu, "
                  f"compute-sanitizer {alias['sanitizer']}): same address "
                  f"{alias['same_address']}, memcheck errors {alias['memcheck_errors']}: "
                  + ("misreported, so sanitize.sh runs with CUDALAB_GRAPH_KEEP_TEMPORARIES=1."
                     if alias["misreported"] else "not misreported.")]
    if data.get("findings"):
        lines += ["", "## What the sanitizer found", ""]
        for f in data["findings"]:
            lines.append(f"- {f['date']}, {f['tool']} / {f['part']}: **before**: {f['before']}. "
                         f"**Cause**: {f['cause']}. **After**: {f['after']}.")
    lines += ["", "## Runs", ""]
    for key in sorted(data["runs"]):
        r = data["runs"][key]
        outcome = (f"stopped by the time limit after {r['seconds']} s" if r["pytest_rc"] == 124
                   else f"{r['errors']} errors, {r['seconds']} s")
        lines.append(f"- `{key}`: {outcome}, commit {r['commit']}, "
                     f"compute-sanitizer {r['sanitizer']}, {r['date']}; `{r['command']}`")
        for rep in r["reports"]:
            lines.append(f"  - {rep['count']} x {rep['report']}")
    results_path("md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:len(parts) + 6]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command_name", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--tool", choices=TOOLS, required=True)
    rec.add_argument("--part", required=True)
    rec.add_argument("--pass", dest="pass_", choices=("main", "deliberate"), required=True)
    rec.add_argument("--logs", required=True)
    rec.add_argument("--tag", required=True)
    rec.add_argument("--rc", type=int, required=True)
    rec.add_argument("--seconds", type=int, required=True)
    rec.add_argument("--command", required=True)
    rec.add_argument("--options", default="")
    rec.set_defaults(func=record)
    pro = sub.add_parser("probe")
    pro.add_argument("--log", required=True)
    pro.set_defaults(func=probe)
    tab = sub.add_parser("table")
    tab.set_defaults(func=table)
    args = parser.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
