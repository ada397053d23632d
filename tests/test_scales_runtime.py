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
