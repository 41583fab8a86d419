"""The colocated baseline's module, run as its docstring shows."""

import os
import runpy
import sys
import warnings

import pytest
import torch


def test_help_prints_the_usage_rather_than_a_config_error(monkeypatch, capsys) -> None:
    """``python -m asyncrl.consumers.colocated --help``, run as ``-m`` runs it (in this process,
    where torch is imported already: a new interpreter spends ~10 s importing it). What the
    module sets for its process (torch's threads, the hub offline) is put back after."""
    monkeypatch.setattr(sys, "argv", ["colocated", "--help"])
    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as done, warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # imported already, as a module
            runpy.run_module("asyncrl.consumers.colocated", run_name="__main__", alter_sys=True)
    finally:
        torch.set_num_threads(threads)
    assert done.value.code == 0
    out = capsys.readouterr()
    assert "python -m asyncrl.consumers.colocated --config calculator" in out.out
    assert "Traceback" not in out.err
