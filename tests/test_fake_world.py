"""Communication on a fake process group: the same collectives, the same bytes, as real ranks."""
import pytest
import torch

from course_utils.distributed import launch
from course_utils.distributed.sharding import STRATEGIES, predicted_comm_bytes
from course_utils.experiments import sharding as lesson
from course_utils.experiments.toys import settings
from course_utils.ledger import fake_mode, fake_world, measure
from course_utils.experiments.planning import tensor_parallel_ledger

# one step: DDP rebuilds its buckets before a second step, in C++ that reads the data
CFG = dict(width=64, depth=4, batch=4, steps=1)
LINES = ("flops", "forward_flops", "backward_flops", "activation_bytes", "param_bytes",
         "grad_bytes", "optimizer_bytes", "comm_bytes", "comm")


def _real(rank, world_size, strategy):
    r = lesson.train_and_measure(rank, world_size, strategy, settings(CFG, lesson.DEFAULTS))
    return {k: getattr(r["record"], k) for k in LINES} | {"state": r["state"], "held": r["held_after_forward"]}


def _fake(world_size, strategy, cfg=CFG):
    with fake_world(world_size) as mesh, fake_mode():
        r = lesson.train_and_measure(0, world_size, strategy, settings(cfg, lesson.DEFAULTS), mesh=mesh)
    return {k: getattr(r["record"], k) for k in LINES} | {"state": r["state"], "held": r["held_after_forward"]}, r


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fake_world_of_two_equals_real_gloo(strategy):
    real = launch(_real, 2, strategy)[0]
    fake, r = _fake(2, strategy)
    assert r["record"].fake and real["comm_bytes"] > 0
    assert fake == real, "fake and real 2-rank ledgers differ"


@pytest.mark.parametrize("world_size", [8, 64, 1024])
@pytest.mark.parametrize("strategy,stage", [("ddp", "ddp"), ("fsdp", "zero3"), ("fsdp_keep", "zero2")])
def test_any_world_size_matches_the_ring_formula(world_size, strategy, stage):
    cfg = dict(CFG, width=max(64, world_size))   # every weight row splits evenly over the ranks
    fake, r = _fake(world_size, strategy, cfg)
    pb = r["param_bytes"]
    assert fake["comm_bytes"] == pytest.approx(predicted_comm_bytes(pb, world_size, stage), abs=3)
    sharded = strategy != "ddp"
    assert fake["state"]["params"] == (pb // world_size if sharded else pb)
    assert fake["state"]["optimizer"] == (2 * pb // world_size if sharded else 2 * pb)


def test_zero1_broadcasts_each_parameter_from_its_owner():
    fake, r = _fake(8, "zero1")
    pb = r["param_bytes"]
    assert {k: v["payload_bytes"] for k, v in fake["comm"].items()} == {"all_reduce": pb, "broadcast": pb}
    assert fake["comm_bytes"] == pytest.approx(3 * 7 / 8 * pb, abs=2)
    assert fake["state"]["optimizer"] < 2 * pb   # only the parameters this rank owns


def _tp_real(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world_size,))
    rec = tensor_parallel_ledger(mesh, hidden=32, batch=4, seq=8, layers=2)
    return {k: getattr(rec, k) for k in LINES}


def test_tensor_parallel_fake_equals_real_and_scales():
    real = launch(_tp_real, 2)[0]
    with fake_world(2) as mesh, fake_mode():
        fake = tensor_parallel_ledger(mesh, hidden=32, batch=4, seq=8, layers=2)
    assert {k: getattr(fake, k) for k in LINES} == real and real["comm"]["all_reduce"]["calls"] > 0
    for n in (8, 64, 1024):
        with fake_world(n) as mesh, fake_mode():
            rec = tensor_parallel_ledger(mesh, hidden=4096, batch=1, seq=64, layers=2)
        activations = 1 * 64 * 4096 * 4   # one b×s×h fp32 tensor per all-reduce
        # Megatron: forward all-reduce after each row-parallel Linear; backward one before each
        # column-parallel Linear whose input needs a gradient (the first layer's does not)
        assert rec.comm["all_reduce"] == {"calls": 2 * 2 - 1, "payload_bytes": 3 * activations,
                                          "sent_bytes": round(2 * (n - 1) / n * 3 * activations)}
        assert rec.param_bytes == 2 * 4 * (4096 * 4 * 4096 * 2 + 4 * 4096) // n + 2 * 4 * 4096


def test_fake_world_refuses_a_nested_group():
    with fake_world(2):
        with pytest.raises(RuntimeError, match="already initialised"):
            with fake_world(4):
                pass
    with pytest.raises(ValueError):
        with fake_world(0):
            pass


def test_a_plain_ddp_in_fake_world_is_told_the_fix_and_the_hooked_one_runs():
    from torch.nn.parallel import DistributedDataParallel as DDP
    from course_utils.ledger.comm_count import allreduce_mean_hook
    with pytest.raises(RuntimeError, match="register_comm_hook"):
        with fake_world(4), fake_mode():
            plain = DDP(torch.nn.Linear(4, 4), init_sync=False)
            plain(torch.randn(2, 4)).sum().backward()
    with fake_world(4), fake_mode():
        hooked = DDP(torch.nn.Linear(4, 4), init_sync=False)
        hooked.register_comm_hook(None, allreduce_mean_hook)
        rec = measure(lambda: hooked(torch.randn(2, 4)).sum().backward(), model=hooked)
    assert rec.comm_bytes == 2 * 3 / 4 * 4 * (16 + 4)   # the fp32 gradients, all-reduced in a ring


def test_no_process_group_no_comm():
    layer = torch.nn.Linear(4, 4)
    rec = measure(lambda: layer(torch.randn(2, 4)).sum().backward(), model=layer)
    assert rec.comm_bytes == 0 and rec.comm == {} and rec.world_size == 1


def test_plan_run_gives_fit_margin_and_time():
    from course_utils.experiments.planning import plan_run
    from course_utils.plots import planner_widget
    plan = plan_run("GPT 1.3B", per_device_batch=1, devices=8, strategy="fsdp", size=256,
                    device_bytes=80e9, peak_flops=1e14, mfu=0.5)
    rec, h = plan["record"], 2048
    # FSDP gathers the 16-bit root (embeddings, final norm) and two blocks at a time
    assert plan["gathered_bytes"] == 2 * ((32000 + 256) * h + 2 * h + 2 * (12 * h * h + 13 * h))
    assert plan["needed_bytes"] == rec.resident_bytes + rec.activation_bytes + plan["gathered_bytes"]
    assert any("MixedPrecisionPolicy" in a for a in plan["assumptions"])
    assert any("flash" in a for a in plan["assumptions"])
    assert plan["fits"] and plan["margin_bytes"] == 80e9 - plan["needed_bytes"]
    assert plan["step_seconds"] == rec.flops / 5e13 and rec.comm_bytes > 0
    with pytest.raises(ValueError):
        plan_run("SimCLR ResNet-50", per_device_batch=2, devices=8, strategy="fsdp")
    assert planner_widget() is not None


GPT = dict(layers=2, hidden=64, heads=4, vocab=97, seq=32, batch=2)


def _gpt_real(rank, world_size, attention):
    from torch.distributed.device_mesh import init_device_mesh
    from course_utils.experiments.planning import gpt_ledger
    record = gpt_ledger(**GPT, strategy="fsdp", mesh=init_device_mesh("cpu", (world_size,)),
                        attention=attention)
    return {k: getattr(record, k) for k in LINES}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_planners_fsdp_mixed_precision_step_fake_equals_real_gloo(attention):
    """FSDP2's MixedPrecisionPolicy (bf16 gathers, fp32 reduce-scatter) and the parameters it
    gathers and frees: the fake world books what two real gloo ranks measure, line by line."""
    from course_utils.experiments.planning import gpt_ledger
    real = launch(_gpt_real, 2, attention)[0]
    with fake_world(2) as mesh, fake_mode():
        fake = gpt_ledger(**GPT, strategy="fsdp", mesh=mesh, attention=attention)
    assert fake.fake and real["comm_bytes"] > 0
    assert {k: getattr(fake, k) for k in LINES} == real
