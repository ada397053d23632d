import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_utils.runtime import describe_device, map_runs, setup, step_bars
from course_utils.scales import config, resolve_scale

ROOT = Path(__file__).resolve().parent.parent


def test_config_picks_preset_and_env(monkeypatch):
    cfg = config("ci", ci=dict(steps=2), default=dict(steps=200))
    assert cfg.steps == 2 and cfg.scale == "ci" and cfg.seed == 0
    assert config("gpu", ci=dict(steps=2), default=dict(steps=200)).steps == 200
    monkeypatch.setenv("COURSE_SCALE", "ci")
    assert resolve_scale(None) == "ci"


def test_config_errors():
    with pytest.raises(ValueError, match="one of"):
        config("huge", ci={}, default={})
    with pytest.raises(ValueError, match="same keys"):
        config("ci", ci=dict(a=1), default=dict(a=1, b=2))


def test_setup_seeds_and_device():
    a = (setup("ci", seed=3), torch.rand(3))
    b = (setup("ci", seed=3), torch.rand(3))
    assert a[0].type == "cpu" and torch.equal(a[1], b[1])
    assert describe_device()["torch"] == torch.__version__


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_gpu_scale_without_gpu_says_what_to_do():
    with pytest.raises(RuntimeError, match="SCALE='default'"):
        setup("gpu")


def test_the_device_chooses_the_scale_when_nobody_else_does(monkeypatch, capsys):
    """A Colab GPU runtime runs the gpu preset without an edit; $COURSE_SCALE and the
    parameters cell still win; setup says which chose."""
    import torch
    from course_utils import runtime, scales
    monkeypatch.delenv("COURSE_SCALE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert scales.auto_scale() == "default"
    runtime.setup("default")
    assert "SCALE = 'default', chosen by the device: no CUDA" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla T4")
    assert scales.auto_scale() == "gpu" and "Tesla T4" in scales.scale_reason("gpu")
    assert scales.scale_reason("ci") == "set in the parameters cell (or by papermill)"
    monkeypatch.setenv("COURSE_SCALE", "ci")
    assert scales.scale_reason("ci") == "from $COURSE_SCALE"


def test_course_device_runs_a_ci_lesson_on_the_gpu(monkeypatch):
    """$COURSE_DEVICE=cuda moves a ci or default lesson to the GPU (gpu_check's --lesson-scale ci:
    every lesson's device code path in minutes); without a GPU, or with a value it does not
    know, it says what to do instead of running somewhere else."""
    import torch
    from course_utils import runtime
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runtime.pick_device("ci") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="unset it"):
        runtime.pick_device("ci")
    monkeypatch.setenv("COURSE_DEVICE", "gpu0")
    with pytest.raises(ValueError, match="'cuda' or 'cpu'"):
        runtime.pick_device("default")
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert runtime.pick_device("ci") == torch.device("cpu")
    with pytest.raises(ValueError, match="cannot run SCALE='gpu'"):
        runtime.pick_device("gpu")


def _train_a_little(seed):
    """A seeded run: a linear model, a few SGD steps on data of its own seed."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return {"loss": loss.item(), "model": model, "threads": torch.get_num_threads()}


def test_runs_in_forked_workers_return_what_they_return_here():
    """Two workers (forked, one thread each) give every key the result one thread gives it in this
    process, in the order of the keys; a lambda will do, since fork passes it without pickling."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        here = map_runs(_train_a_little, [3, 1, 2], workers=1)
    finally:
        torch.set_num_threads(threads)
    forked = map_runs(lambda s: _train_a_little(s), [3, 1, 2], workers=2)
    assert list(forked) == [3, 1, 2]
    for seed in here:
        assert forked[seed]["loss"] == here[seed]["loss"] and forked[seed]["threads"] == 1
        assert torch.equal(forked[seed]["model"].weight, here[seed]["model"].weight)


def test_a_failing_run_fails_the_map_and_bad_workers_say_so():
    def boom(seed):
        raise ValueError(f"run {seed} failed")
    for workers in (1, 2):
        with pytest.raises(ValueError, match=r"run \d failed") as failed:
            map_runs(boom, [1, 2], workers=workers)
        assert any("in map_runs' run" in note for note in failed.value.__notes__)
    with pytest.raises(ValueError, match="workers"):
        map_runs(_train_a_little, [1], workers=0)


def test_runs_show_step_bars_only_where_they_run_here_on_a_gpu():
    """step_bars() is what a run passes to fit's progress: True for the runs map_runs calls here
    for a GPU (no CUDA needed: the runs below touch no device), False for CPU runs here and in
    forked workers, and outside map_runs, also after a GPU map (and one that failed)."""
    assert step_bars() is False
    assert map_runs(lambda s: step_bars(), [1, 2], device="cuda", workers=2) == {1: True, 2: True}
    assert step_bars() is False
    assert map_runs(lambda s: step_bars(), [1, 2], device="cpu", workers=1) == {1: False, 2: False}
    assert map_runs(lambda s: step_bars(), [1, 2], device="cpu", workers=2) == {1: False, 2: False}

    def fails(seed):
        raise ValueError(f"run {seed} failed")
    with pytest.raises(ValueError):
        map_runs(fails, [1], device="cuda")
    assert step_bars() is False


def test_runs_may_map_runs_of_their_own():
    """A run that maps runs of its own (here, in this process and forked) leaves the outer map's
    function in place for its later keys."""
    def outer(seed):
        inner = map_runs(lambda s: s * 10, [seed, seed + 1], workers=2)
        return sum(inner.values())
    assert map_runs(outer, [1, 2, 3], workers=1) == {1: 30, 2: 50, 3: 70}


def test_after_a_fake_backward_the_runs_happen_here_with_the_same_results():
    """A backward on fake tensors starts autograd's device threads, after which torch refuses
    backward in every forked child; map_runs then runs the keys in this process, one thread each,
    and says so. In a fresh process, so that this one keeps forking."""
    script = (
        "import torch\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "from course_utils.runtime import map_runs\n"
        "from test_scales_runtime import _train_a_little\n"
        "torch.set_num_threads(2)\n"
        "before = map_runs(_train_a_little, [1, 2], workers=2)\n"
        "with FakeTensorMode():\n"
        "    x = torch.randn(4, 4, requires_grad=True)\n"
        "    (2 * x).sum().backward()\n"
        "after = map_runs(_train_a_little, [1, 2], workers=2)\n"
        "assert all(after[k]['loss'] == before[k]['loss'] and after[k]['threads'] == 1 for k in (1, 2))\n"
        "assert torch.get_num_threads() == 2\n"
        "print('same results')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "runs happen here, one after the other, one thread each" in done.stdout
    assert "same results" in done.stdout
