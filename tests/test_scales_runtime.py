import pytest
import torch

from course_utils.runtime import describe_device, setup
from course_utils.scales import config, resolve_scale


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
