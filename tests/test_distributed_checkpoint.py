"""torch.distributed.checkpoint reshards: saved by 2 ranks, loaded by 1, and the reverse; the
checkpoint folder is the caller's (a shared path), not a temp dir on rank 0's machine."""
import torch

from course_utils.distributed import launch
from course_utils.experiments import sharding as lesson
from course_utils.experiments.toys import make_stack

CFG = {"steps": 2, "width": 16, "depth": 2}


def assert_same_state(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for key in a:
        assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key


def test_saved_on_two_ranks_loads_on_one_and_back(tmp_path):
    two = launch(lesson.dcp_save, 2, str(tmp_path / "by2"), CFG, timeout=240)
    assert_same_state(two[0], two[1])                         # whole state, the same on each rank
    one = launch(lesson.dcp_load, 1, str(tmp_path / "by2"), CFG, timeout=240)
    assert_same_state(one[0], two[0])
    assert any(k.endswith("exp_avg_sq") for k in one[0])     # Adam's moments came along

    saved_by_one = launch(lesson.dcp_save, 1, str(tmp_path / "by1"), CFG, timeout=240)
    loaded_by_two = launch(lesson.dcp_load, 2, str(tmp_path / "by1"), CFG, timeout=240)
    for r in range(2):
        assert_same_state(loaded_by_two[r], saved_by_one[0])
    # the loading model starts from other weights, so the equalities above come from the load
    fresh = make_stack(CFG["width"], CFG["depth"], lesson.DEFAULTS["seed"] + 1)
    assert not torch.equal(fresh[0].weight.detach(), two[0]["param.0.weight"])


def test_roundtrip_writes_where_it_is_told_and_leaves_the_folder(tmp_path):
    out = launch(lesson.checkpoint_roundtrip, 2, CFG, str(tmp_path / "ckpt"), timeout=240)
    for r in out:
        assert r["exact"] and r["next_step_equal"] and r["keys_match"]
    assert (tmp_path / "ckpt" / ".metadata").is_file()         # the caller owns the folder
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
