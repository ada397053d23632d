"""The planner's compute (``experiments.planning.plan_run`` and ``ledger_lines``), live on fake tensors:
each choice the widget offers changes the ledger line it should and no other."""
import pytest

from course_utils.experiments.planning import PLANNED_MODELS, ledger_lines, plan_run

SMALL = dict(per_device_batch=2, size=64, devices=2)


def lines(plan):
    return {row["line"]: row["per device"] for row in ledger_lines(plan["record"])}


@pytest.mark.parametrize("model", ["SimCLR ResNet-50", "MoCo v2 ResNet-50", "MAE ViT-L/16"])
def test_ssl_plans_all_reduce_every_gradient_once(model):
    plan = plan_run(model, **SMALL)
    rec = plan["record"]
    # DDP over n=2 ranks sends 2(n-1)/n of the fp32 gradients: exactly their bytes. MoCo's key
    # encoder has no gradients, so it is neither sent nor counted.
    assert rec.comm_bytes == rec.grad_bytes > 0 and rec.world_size == 2
    assert plan["needed_bytes"] == rec.resident_bytes + rec.activation_bytes
    table = lines(plan)
    # compute, then the six lines (repeated in two rows: recomputed FLOPs, re-encoded items)
    assert len(table) == 8 and table["communicated (GB sent)"] == rec.comm_bytes / 1e9
    assert table["repeated: recomputed in backward (TFLOP)"] == 0
    assert table["repeated: items encoded twice (re-encoded)"] == 0   # no gradient cache here
    assert table["compute (TFLOP/step)"] == rec.flops / 1e12


def test_moco_queue_is_the_cache_line_and_mae_mask_ratio_sets_encoded_tokens():
    small, large = (plan_run("MoCo v2 ResNet-50", queue_size=q, **SMALL)["record"] for q in (4096, 16384))
    assert large.cache_bytes - small.cache_bytes == (16384 - 4096) * (128 * 4 + 2 * 8)  # keys, written_at, ids
    # backward keeps the queue's snapshot that q·queueᵀ read (enqueueing overwrites the queue)
    # and the B×K logits: 128·4 + B·4 bytes more per key
    assert large.activation_bytes - small.activation_bytes == (16384 - 4096) * (128 * 4 + 2 * 4)
    assert large.flops > small.flops
    for ratio in (0.5, 0.75):
        rec = plan_run("MAE ViT-L/16", mask_ratio=ratio, **SMALL)["record"]
        assert rec.encoded["encoder tokens"] == 2 * round(16 * (1 - ratio))   # 64 px: 16 patches


@pytest.mark.parametrize("model,size", [("SimCLR ResNet-50", 64), ("GPT 1.3B", 128)])
def test_mixed_precision_halves_kept_bytes_per_sample_and_adds_weight_copies(model, size):
    runs = {(p, b): plan_run(model, per_device_batch=b, size=size, devices=1, precision=p)["record"]
            for p in ("fp32", "bf16-mixed", "fp16-mixed") for b in (2, 4)}
    params = runs["fp32", 2].param_bytes // 4
    # autocast keeps fp32 parameters, gradients and optimizer state, and the same FLOPs
    assert len({r.resident_bytes for r in runs.values()}) == 1
    assert len({r.flops for r in runs.values() if r is not None}) == 2   # one per batch size
    per_sample = {p: (runs[p, 4].activation_bytes - runs[p, 2].activation_bytes) / 2
                  for p in ("fp32", "bf16-mixed", "fp16-mixed")}
    for low in ("bf16-mixed", "fp16-mixed"):
        # 2-byte activations (a few ops stay fp32: softmax inputs, losses, norms' statistics)...
        assert 0.45 < per_sample[low] / per_sample["fp32"] < 0.6
        # ...plus a 2-byte copy of every weight, saved for backward once per step, not per sample
        fixed = runs[low, 2].activation_bytes - 2 * per_sample[low]
        fixed_fp32 = runs["fp32", 2].activation_bytes - 2 * per_sample["fp32"]
        assert (fixed - fixed_fp32) / params == pytest.approx(2, rel=0.01)


def test_optimizer_sets_the_state_copies():
    runs = {o: plan_run("SimCLR ResNet-50", optimizer=o, **SMALL)["record"] for o in ("sgd", "sgd-momentum", "adamw")}
    grads = runs["sgd"].grad_bytes
    assert [runs[o].optimizer_bytes for o in ("sgd", "sgd-momentum", "adamw")] == [0, grads, 2 * grads]
    assert len({r.activation_bytes for r in runs.values()}) == 1


def test_planner_says_what_it_cannot_plan():
    assert len(PLANNED_MODELS) == 6
    with pytest.raises(ValueError, match="GPT models only"):
        plan_run("MAE ViT-L/16", recompute="full", **SMALL)
    with pytest.raises(ValueError):
        plan_run("MoCo v2 ResNet-50", strategy="fsdp", **SMALL)
    with pytest.raises(ValueError):
        plan_run("GPT 1.3B", per_device_batch=1, devices=2, precision="fp8")


def test_the_planner_keeps_what_cuda_autocast_keeps_for_eager_attention():
    """On a CPU the planner still applies CUDA autocast's rules: softmax in fp32, so one eager
    layer keeps 6 bytes per attention score (memory.tinygpt_layer_activation_bytes, autocast
    'cuda'), not CPU autocast's 2, plus autocast's bf16 copies of the layer's four weight matrices
    (12h² elements). A layer's cost is the difference between a 2- and a 1-layer model."""
    from course_utils import memory as M
    from course_utils.ledger.fake import fake_mode
    from course_utils.experiments.planning import gpt_ledger
    cfg = dict(hidden=64, heads=4, vocab=97, seq=32, batch=2)
    kept = {}
    for layers in (1, 2):
        with fake_mode():
            kept[layers] = gpt_ledger(layers=layers, **cfg, attention="eager").activation_bytes
    layer = M.tinygpt_layer_activation_bytes(cfg["seq"], cfg["batch"], cfg["hidden"], cfg["heads"],
                                             autocast="cuda")
    assert kept[2] - kept[1] == layer + 2 * 12 * cfg["hidden"] ** 2


def test_sdpa_keeps_no_attention_scores():
    """Fused attention keeps its output and one fp32 log-sum-exp per row instead of the s²
    probabilities: kept for backward is affine in the sequence (doubling s doubles the growth;
    the constant is autocast's weight copies), eager's grows faster."""
    from course_utils.ledger.fake import fake_mode
    from course_utils.experiments.planning import gpt_ledger
    kept = {}
    for attention in ("sdpa", "eager"):
        for seq in (64, 128, 256):
            with fake_mode():
                kept[attention, seq] = gpt_ledger(layers=2, hidden=64, heads=4, vocab=97, seq=seq,
                                                  batch=1, attention=attention).activation_bytes

    def growth_ratio(kind):
        return (kept[kind, 256] - kept[kind, 128]) / (kept[kind, 128] - kept[kind, 64])
    assert growth_ratio("sdpa") == pytest.approx(2, rel=1e-3)
    assert growth_ratio("eager") > 2.5


def test_the_planners_gpt_step_keeps_on_cuda_what_its_cpu_plan_books():
    """The planner measures its GPT step under CPU autocast (with ``softmax_as_on_cuda``) and plans
    a GPU run. Its forward and loss (``gpt_loss``), run on fake CUDA tensors under CUDA's own
    autocast rules and without the softmax shim, keep exactly the bytes the CPU run keeps, with
    eager attention; so the plan adds no device term (a loss inside CUDA autocast would keep 2
    bytes per logit more: memory.cuda_autocast_logit_bytes). With fused attention the CUDA run
    takes flash (a CPU-only torch would send fake CUDA attention to its math path)."""
    from course_utils.experiments.planning import gpt_forward_kept
    seq, batch = 64, 2
    shape = dict(layers=2, hidden=64, heads=4, vocab=500, seq=seq, batch=batch)
    planned = gpt_forward_kept("cpu", **shape)
    assert gpt_forward_kept("cuda", **shape) == planned
    # without the shim, CPU's rules keep the s² probabilities in bf16: 4 bytes per score fewer
    scores = shape["layers"] * shape["heads"] * seq * seq * batch
    assert planned - gpt_forward_kept("cpu", **shape, softmax_shim=False) == 4 * scores

    # sdpa, as the DDP rows plan it: CUDA's flash kernel keeps what the CPU's does, plus its
    # random-number state its meta kernel declares (a 2-element and a 0-d uint64 tensor, 24 bytes) in every layer
    for layers in (2, 3):
        sdpa = {**shape, "layers": layers, "attention": "sdpa"}
        assert gpt_forward_kept("cuda", **sdpa) - gpt_forward_kept("cpu", **sdpa) == 24 * layers

    plan = plan_run("GPT 1.3B", per_device_batch=1, devices=2, strategy="ddp", size=128)
    rec = plan["record"]
    assert plan["needed_bytes"] == rec.resident_bytes + rec.activation_bytes
    assert any("fake CUDA" in line for line in plan["assumptions"])
