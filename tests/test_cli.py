"""The command line: `python -m cudalab` / the `cudalab` console script."""

from __future__ import annotations

import json

import pytest

import cudalab
from cudalab import cli
from _support import no_gpu_only, run_cli


def test_help_lists_check():
    result = run_cli("--help")
    assert result.returncode == 0
    assert "check" in result.stdout


def test_check_help():
    result = run_cli("check", "--help")
    assert result.returncode == 0
    assert "--json" in result.stdout


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout == f"cudalab {cudalab.__version__}\n"
    assert "--version" in run_cli("--help").stdout


def test_check_json_into_a_missing_directory_is_a_usage_error(tmp_path):
    result = run_cli("check", "--json", str(tmp_path / "missing" / "report.json"))
    assert result.returncode == 2
    assert "argument --json: directory" in result.stderr and "does not exist" in result.stderr
    assert not (tmp_path / "missing").exists()


def test_no_command_prints_help_and_fails():
    result = run_cli()
    assert result.returncode == 2
    assert "usage: cudalab" in result.stdout


def test_unknown_command_is_an_error():
    result = run_cli("frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


@no_gpu_only
def test_check_without_gpu_exits_1_with_a_clear_message(tmp_path):
    out = tmp_path / "report.json"
    result = run_cli("check", "--json", str(out))
    assert result.returncode == 1
    assert "no CUDA device is available" in result.stderr
    assert "CUDA runtime" in result.stderr
    assert result.stdout == ""
    assert not out.exists()


@pytest.mark.gpu
def test_check_reports_every_device(tmp_path):
    out = tmp_path / "report.json"
    result = run_cli("check", "--json", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["device_count"] == cudalab.device_count() == len(report["devices"])
    for index, device in enumerate(report["devices"]):
        assert device["name"] == cudalab.get_device_name(index)
        assert device["name"] in result.stdout
        assert 0 < device["free_memory"] <= device["total_memory"]
        assert device["peak_memory_bandwidth"] > 0
    assert "Peak memory bandwidth" in result.stdout


@pytest.mark.gpu
def test_check_report_in_process():
    report = cli.check_report()
    assert report["cuda_runtime"] == cudalab.runtime_version()
    assert tuple(report["devices"][0]["compute_capability"]) == cudalab.get_device_capability(0)
