"""The Colab path of every lesson notebook: the badge opens the lesson's student edition from the
course repo (tools/template.py's REPO at REF),
the install cell is tools/template.py's INSTALL_CELL (one pip command on Colab, nothing elsewhere),
the parameters cell defines SCALE from COURSE_SCALE, and SCALE="gpu" without CUDA stops with a
message that says what to do.

The per-notebook rules (the badge, the install cell first, the parameters cell, setup(SCALE, ...)
after it) are in tests/notebook_rules.py, run once per lesson by tests/test_notebook_rules.py;
here: the install cell's behaviour on and off Colab, retargeting a fork, the runtime's messages.
"""
from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from template import INSTALL_CELL, REF, REPO, badge, kit_source, retarget  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_name.ipynb: run `make notebooks`"


def _run_install_cell(monkeypatch, on_colab: bool) -> list:
    calls = []
    monkeypatch.setattr("subprocess.run", lambda *a, **k: calls.append((a, k)))
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(INSTALL_CELL, "install-cell", "exec"), {})
    return calls


def test_install_cell_does_nothing_off_colab(monkeypatch):
    assert _run_install_cell(monkeypatch, on_colab=False) == []


def test_install_cell_is_one_unpinned_pip_command_on_colab(monkeypatch):
    calls = _run_install_cell(monkeypatch, on_colab=True)
    assert len(calls) == 1
    (cmd,), kwargs = calls[0]
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"] and kwargs.get("check") is True
    targets = [a for a in cmd[4:] if not a.startswith("-")]
    assert targets == [kit_source()] == [f"git+https://github.com/{REPO}.git@{REF}"]


def test_a_fork_retargets_badge_and_install_cell_in_one_command(tmp_path):
    """docs: `python tools/template.py --repo you/fork --ref dev` rewrites the one setting and
    every lesson source's badge and install cell."""
    src = tmp_path / "notebooks" / "src"
    src.mkdir(parents=True)
    lesson = (ROOT / "notebooks" / "src" / "01_resource_ledger.py").read_text()
    (src / "01_resource_ledger.py").write_text(lesson)
    template = tmp_path / "template.py"
    template.write_text((ROOT / "tools" / "template.py").read_text())
    changed = retarget("you/fork", "dev", root=tmp_path, setting=template)
    text = (src / "01_resource_ledger.py").read_text()
    assert changed == [src / "01_resource_ledger.py", template]
    assert badge("01_resource_ledger", "you/fork", "dev") in text and badge("01_resource_ledger") not in text
    assert "git+https://github.com/you/fork.git@dev" in text and INSTALL_CELL not in text
    assert 'REPO = "you/fork"' in template.read_text() and 'REF = "dev"' in template.read_text()
    with pytest.raises(ValueError, match="owner/name"):
        retarget("not a repo", "main", root=tmp_path, setting=template)


def test_kit_does_not_pin_torch_exactly():
    """An exact pin would replace Colab's CUDA build of torch on every install."""
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"(?s)^dependencies = \[(.*?)\]", text, re.M).group(1)
    pins = [d for d in re.findall(r'"([^"]+)"', deps) if "==" in d]
    assert not pins, f"exact pins in pyproject dependencies: {pins}"
    assert re.search(r'"torch>=', deps)


def _runtime():
    try:
        from course_utils import runtime
    except ImportError:
        pytest.skip("course_utils.runtime does not exist yet")
    return runtime


def test_gpu_scale_without_cuda_says_what_to_do(monkeypatch):
    runtime = _runtime()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as err:
        runtime.setup("gpu")
    msg = str(err.value)
    assert "CUDA" in msg or "GPU" in msg
    assert "Colab" in msg and "SCALE" in msg, f"the message should say how to fix it: {msg}"


def test_gpu_scale_with_cuda_selects_cuda(monkeypatch):
    runtime = _runtime()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: None)
    was = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        device = runtime.setup("gpu", seed=0)
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
    assert torch.device(device).type == "cuda"
