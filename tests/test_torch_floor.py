"""The torch floor: one value in pyproject.toml and in the ranks' check, and releases below it refused."""

from __future__ import annotations

import re

import pytest
import torch

from ddlbench.errors import DdlbenchError
from ddlbench.launch.runner import run_point
from ddlbench.train.torch_floor import TORCH_FLOOR, check_torch_floor, release
from tests.conftest import REPO, make_point


def test_pyproject_declares_the_floor_the_ranks_check():
    declared = re.findall(r'"torch>=([0-9.]+)"', (REPO / "pyproject.toml").read_text())
    assert declared == [TORCH_FLOOR]


@pytest.mark.parametrize("version", ["2.6.0+cu124", "2.7.0+cu126", "2.8.0", "2.9.1+cu128", "1.13.1"])
def test_a_release_below_the_floor_is_refused_naming_both(version):
    with pytest.raises(DdlbenchError, match=re.escape(version)) as refusal:
        check_torch_floor(version)
    assert f"torch>={TORCH_FLOOR}" in str(refusal.value)


@pytest.mark.parametrize("version", ["2.10.0+cu128", "2.11.0a0+git1234abc", "2.13.0+cpu", "3.0"])
def test_the_floor_and_later_releases_pass(version):
    check_torch_floor(version)


def test_release_orders_minor_versions_as_numbers():
    assert release("2.10.0") > release("2.9.1") > release("2.9")


@pytest.mark.slow
def test_a_point_on_a_torch_below_the_floor_is_a_failed_record_saying_why(tmp_path, monkeypatch):
    # the ranks inherit this environment: a sitecustomize in PYTHONPATH makes their torch report 2.9.1
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import torch\ntorch.__version__ = '2.9.1+cu128'\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}:{REPO}")
    record = run_point(make_point(ranks_per_node=2), out=tmp_path / "point" / "record.json", launcher="local")
    assert record.status == "failed"
    assert "torch 2.9.1+cu128 is below ddlbench's floor" in record.reason
    assert torch.__version__ != "2.9.1+cu128"  # this process's torch is untouched
