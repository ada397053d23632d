"""Training-memory predictor: formulas, and agreement with the ledger's measurement."""
import pytest
import torch

from course_utils import memory as M
from course_utils.experiments.training_memory import measure_tinygpt, recompute_tradeoff
from course_utils.ledger import measure
from course_utils.models import MLP, SmallResNet
from course_utils.optim import OPTIMIZERS
from course_utils.plots import plot_memory_breakdown, what_fits_widget
from course_utils.models.transformer import TinyGPT, tinygpt_param_count

CONFIGS = [  # layers, hidden, heads, vocab, seq, batch
    (1, 32, 4, 50, 16, 2),
    (2, 64, 4, 97, 32, 3),
    (3, 48, 6, 64, 24, 4),
]


# --------------------------------------------------------------------------- formulas
def test_bytes_per_param_table():
    per = lambda *a, **k: sum(M.state_bytes_per_param(*a, **k).values())
    assert per("adamw", "bf16-mixed") == 16  # 2 + 2 + 4 master + 8 moments
    assert per("adam", "bf16-mixed", fp32_grad_accumulation=True) == 20
    assert per("adam", "fp32") == 16 and per("sgd", "fp32") == 8 and per("sgd-momentum", "fp32") == 12
    assert M.state_bytes_per_param("adam", "bf16-mixed")["optimizer"] == 8, "moments stay fp32"


def test_korthikanti_per_layer_forms():
    s, b, h, a = 2048, 4, 4096, 32
    assert M.korthikanti_layer_activation_bytes(s, b, h, a) == s * b * h * (34 + 5 * a * s / h)
    assert M.korthikanti_layer_activation_bytes(s, b, h, a, "selective") == 34 * s * b * h
    assert M.korthikanti_layer_activation_bytes(s, b, h, a, "full") == 2 * s * b * h


def test_transformer_memory_keys_and_sums():
    m = M.transformer_memory(12, 768, 12, 50257, 1024, 8, precision="bf16-mixed")
    assert tuple(m) == M.MEMORY_KEYS
    assert m["total"] == sum(v for k, v in m.items() if k != "total")
    n = tinygpt_param_count(12, 768, 50257, 1024)
    assert 124e6 < n < 125e6, "GPT-2 small shape has ~124M parameters"
    assert m["params"] == 2 * n and m["master_params"] == 4 * n and m["optimizer"] == 8 * n
    sel = M.transformer_memory(12, 768, 12, 50257, 1024, 8, precision="bf16-mixed", recompute="selective")
    full = M.transformer_memory(12, 768, 12, 50257, 1024, 8, precision="bf16-mixed", recompute="full")
    assert full["activations"] < sel["activations"] < m["activations"]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_param_count_matches_model(cfg):
    layers, hidden, heads, vocab, seq, _ = cfg
    model = TinyGPT(vocab, seq, layers, hidden, heads)
    assert sum(p.numel() for p in model.parameters()) == tinygpt_param_count(layers, hidden, vocab, seq)


@pytest.mark.parametrize("kwargs, match", [
    (dict(optimizer="lion"), "sgd-momentum"),
    (dict(precision="fp16"), "bf16-mixed"),
    (dict(recompute="half"), "selective"),
])
def test_invalid_choices_name_valid_ones(kwargs, match):
    with pytest.raises(ValueError, match=match):
        M.transformer_memory(2, 64, 4, 100, 32, 2, **kwargs)


def test_invalid_sizes():
    with pytest.raises(ValueError, match="divisible"):
        M.transformer_memory(2, 65, 4, 100, 32, 2)
    with pytest.raises(ValueError, match="batch"):
        M.transformer_memory(2, 64, 4, 100, 32, 0)
    with pytest.raises(ValueError, match="fp32_grad_accumulation"):
        M.state_memory(10, precision="fp32", fp32_grad_accumulation=True)


# --------------------------------------------------------------------------- measured
@pytest.mark.parametrize("mode", M.RECOMPUTE_MODES)
@pytest.mark.parametrize("cfg", CONFIGS[:2])
def test_tinygpt_activations_match_measurement(cfg, mode):
    record, _ = measure_tinygpt(*cfg, recompute=mode, optimizer="adamw", steps=2)
    pred = M.transformer_memory(*cfg, recompute=mode, optimizer="adamw")
    assert record.activation_bytes == pytest.approx(pred["activations"], rel=0.01)
    assert record.param_bytes == pred["params"] and record.grad_bytes == pred["grads"]
    assert record.optimizer_bytes == pred["optimizer"]


@pytest.mark.parametrize("shape", [(2, 64, 4, 100, 32, 3), (1, 48, 6, 64, 24, 2)])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_fused_attention_keeps_no_s2_term_byte_for_byte(shape, recompute):
    """attention="sdpa": what TinyGPT keeps is the derived count exactly; eager keeps a·s²·b more
    per layer (fp32) and the sdpa kernel's own output and log-sum-exp less."""
    layers, hidden, heads, vocab, seq, batch = shape
    torch.manual_seed(0)
    model = TinyGPT(vocab, seq, layers, hidden, heads, recompute=recompute, attention="sdpa")
    x, y = torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq))
    record = measure(lambda: model.loss(x, y).backward(), model=model)
    assert record.activation_bytes == M.tinygpt_activation_bytes(
        layers, hidden, heads, vocab, seq, batch, recompute=recompute, attention="sdpa")
    if recompute == "none":
        eager = M.tinygpt_activation_bytes(layers, hidden, heads, vocab, seq, batch)
        s, b = seq, batch
        assert eager - record.activation_bytes == layers * (4 * heads * s * s * b - 4 * s * b * hidden
                                                            - 4 * heads * s * b)


def test_what_fits_counts_fused_attention_unless_told_eager():
    sdpa = M.what_fits("GPT-2 small (124M)", batch=8, seq=1024)
    eager = M.what_fits("GPT-2 small (124M)", batch=8, seq=1024, attention="eager")
    shape, s, b = M.PRESETS["GPT-2 small (124M)"], 1024, 8
    per_layer = 5 * shape["heads"] * s * s * b - 2 * s * b * shape["hidden"] - 4 * shape["heads"] * s * b
    assert eager["breakdown"]["activations"] - sdpa["breakdown"]["activations"] == shape["layers"] * per_layer
    # with fused attention selective recomputation has nothing to recompute
    assert M.what_fits("GPT-2 small (124M)", batch=8, seq=1024, recompute="selective")["total"] == sdpa["total"]
    with pytest.raises(ValueError, match="attention"):
        M.what_fits(attention="flash")


@pytest.mark.parametrize("name, factor", [("sgd", 0), ("sgd-momentum", 1), ("adam", 2), ("adamw", 2)])
def test_measured_optimizer_state(name, factor):
    record, _ = measure_tinygpt(1, 32, 4, 50, 16, 2, optimizer=name, steps=2)
    assert record.optimizer_bytes == factor * record.param_bytes


def test_recomputation_trades_flops_for_memory():
    rows = {r["mode"]: r for r in recompute_tradeoff(2, 64, 4, 97, 32, 3, repeats=1)}
    assert rows["full"]["activation_bytes"] < rows["selective"]["activation_bytes"] < rows["none"]["activation_bytes"]
    # full recomputation repeats the blocks' forward: between 1.15× and 1.5× the FLOPs here
    assert 1.15 < rows["full"]["flops_ratio"] < 1.5
    assert 1.0 < rows["selective"]["flops_ratio"] < rows["full"]["flops_ratio"]


def test_bf16_autocast_shrinks_activations_not_optimizer_state():
    def measure(batch, autocast):
        return measure_tinygpt(2, 64, 4, 97, 32, batch, autocast=autocast, steps=2)[0]
    # per-sample slope: bf16 weight copies autocast saves do not grow with the batch and cancel
    slope = {ac: measure(8, ac).activation_bytes - measure(4, ac).activation_bytes for ac in (False, True)}
    assert slope[True] < 0.75 * slope[False]
    assert measure(4, True).optimizer_bytes == measure(4, False).optimizer_bytes


def test_kit_models_predicted():
    mlp = MLP(64, 128, 10, layers=3)
    pred = M.model_memory(mlp, (32, 64), optimizer="adam")
    n = sum(p.numel() for p in mlp.parameters())
    assert pred["params"] == 4 * n and pred["optimizer"] == 8 * n and pred["master_params"] == 0
    assert pred["activations"] == 32 * 64 * 4 + 2 * 32 * 128 * 4 + 32 * 10 * 4 + 32 * 8 + 4
    assert M.model_memory(SmallResNet(8, num_classes=10), optimizer="sgd")["optimizer"] == 0


def test_what_fits():
    small = M.what_fits("GPT-2 small (124M)", batch=1, seq=1024, precision="fp16-mixed")
    assert small["fits"] and small["total"] == sum(small["breakdown"].values())
    big = M.what_fits("GPT 7B", batch=1, seq=1024, precision="fp16-mixed")
    assert not big["fits"] and big["breakdown"]["optimizer"] > small["capacity"] / 2
    more = M.what_fits("GPT-2 small (124M)", batch=16, seq=1024, precision="fp16-mixed")
    # every 16-bit activation term is proportional to the batch; resident state is not
    assert more["breakdown"]["activations"] == 16 * small["breakdown"]["activations"]
    assert more["breakdown"]["optimizer"] == small["breakdown"]["optimizer"]
    with pytest.raises(ValueError, match="T4"):
        M.what_fits(device="TPU")


def test_what_fits_uses_the_devices_mixed_precision():
    # a T4 has no bf16: its default is fp16-mixed, which stores the same bytes as bf16-mixed
    t4 = M.what_fits("GPT-2 small (124M)", batch=4, seq=1024)
    a100 = M.what_fits("GPT-2 small (124M)", batch=4, seq=1024, device="A100 80 GB")
    assert t4["breakdown"] == a100["breakdown"]
    assert t4["capacity"] == int(14.7 * 2**30)
    with pytest.raises(ValueError, match="fp16-mixed"):
        M.what_fits(precision="bf16-mixed", device="T4 (Colab) 16 GB")
    assert M.state_bytes_per_param("adamw", "fp16-mixed") == M.state_bytes_per_param("adamw", "bf16-mixed")


@pytest.mark.parametrize("shape", [(1, 32, 4, 50, 16), (2, 64, 4, 97, 32), (3, 48, 6, 64, 24)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("autocast", [False, True])
def test_tinygpt_activation_slope_is_predicted_exactly(shape, recompute, autocast):
    """Per-sample bytes (batch 8 minus batch 4: the bf16 weight copies cancel) on this device."""
    device = "cuda" if autocast and torch.cuda.is_available() else "cpu"
    def measured(batch):
        return measure_tinygpt(*shape, batch, recompute=recompute, autocast=autocast, steps=2,
                               device=device)[0].activation_bytes
    def predicted(batch):
        return M.tinygpt_activation_bytes(*shape, batch, recompute=recompute,
                                          autocast=device if autocast else None)
    assert measured(8) - measured(4) == predicted(8) - predicted(4)


def test_cuda_autocast_keeps_the_softmax_output_three_times_the_cpu_bytes():
    cpu, cuda = (M.tinygpt_layer_activation_bytes(32, 2, 64, 4, autocast=d) for d in ("cpu", "cuda"))
    assert cuda - cpu == 4 * 4 * 32 * 32 * 2     # + the fp32 P (4 bytes per score element)
    with pytest.raises(ValueError, match="autocast"):
        M.tinygpt_layer_activation_bytes(32, 2, 64, 4, autocast="tpu")


def test_optimizer_state_comes_from_the_one_table():
    for name, spec in OPTIMIZERS.items():
        assert M.state_bytes_per_param(name, "fp32")["optimizer"] == 4 * spec.state_copies
        assert M.state_bytes_per_param(name, "bf16-mixed")["optimizer"] == 4 * spec.state_copies


def test_breakdown_plot_and_widget():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    report = M.what_fits("GPT-2 small (124M)", batch=2, seq=256)
    fig = plot_memory_breakdown(report)
    assert "fits" in fig.axes[0].get_title()
    plt.close(fig)
    widget = what_fits_widget()
    assert {"model", "batch", "optimizer", "device"} <= {c.description for c in widget.children
                                                         if hasattr(c, "description")}
    plt.close("all")


def test_cuda_autocast_prediction_matches_the_recorded_h200_run():
    """The first GPU run (benchmarks/gpu_runs/2026-12-04_h200_run1.json, tools/gpu_check.py's
    memory section, torch 2.11 on an H200) measured TinyGPT's kept-for-backward bytes under CUDA
    bf16 autocast at two shapes, with and without full recomputation. Each equals the formula
    plus autocast's bf16 weight copies, byte for byte: every block's 12h² matmul weights and the
    tied head's vh without recomputation, only the head's with full recomputation (the blocks'
    copies are re-made in their re-run). Before the run, the formula lacked the 2·sbv bytes CUDA
    keeps per step for the logits and missed every row."""
    import json
    from pathlib import Path
    report = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_runs"
                         / "2026-12-04_h200_run1.json").read_text())
    rows = [r for r in report["results"]["memory"] if r["bf16_autocast"]]
    assert len(rows) == 4
    for row in rows:
        s = row["shape"]
        layers, hidden, vocab = s["layers"], s["hidden"], s["vocab"]
        copies = 2 * vocab * hidden + (2 * layers * 12 * hidden ** 2 if row["recompute"] == "none" else 0)
        predicted = M.tinygpt_activation_bytes(layers, hidden, s["heads"], vocab, s["seq"], s["batch"],
                                               recompute=row["recompute"], autocast="cuda")
        assert row["measured_activation_bytes"] == predicted + copies, row


def _fake_kept(device_type, shape, recompute="none"):
    from course_utils.experiments.training_memory import tinygpt_kept_under_rules_of
    return tinygpt_kept_under_rules_of(device_type, shape["layers"], shape["hidden"], shape["heads"],
                                       shape["vocab"], shape["seq"], shape["batch"], recompute=recompute)


def test_cuda_autocast_rules_on_fake_cuda_tensors_reproduce_the_h200_run():
    """A CPU predicts the GPU's bytes: the recorded H200 rows (kept for backward under CUDA bf16
    autocast, two shapes, with and without full recomputation) equal, byte for byte, TinyGPT's
    forward run here on fake CUDA tensors under CUDA's autocast rules. Under CPU's rules the same
    forward keeps less at every row, so the rules, not the fake tensors, make the match."""
    import json
    from pathlib import Path
    report = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_runs"
                         / "2026-12-04_h200_run1.json").read_text())
    rows = [r for r in report["results"]["memory"] if r["bf16_autocast"]]
    assert len(rows) == 4
    for row in rows:
        assert _fake_kept("cuda", row["shape"], row["recompute"]) == row["measured_activation_bytes"], row
        assert _fake_kept("cpu", row["shape"], row["recompute"]) < row["measured_activation_bytes"], row


def test_cuda_autocast_keeps_log_softmax_in_bf16_and_an_fp32_copy():
    """memory.cuda_autocast_logit_bytes, derived: under CUDA's rules log-softmax keeps its bf16
    output and NLL a separate fp32 copy (2 + 4 bytes per logit); under CPU's, log-softmax runs
    in fp32 and NLL keeps that same tensor (4). On either device the slope in the batch is
    ``tinygpt_activation_bytes``'s, which books that term for CUDA."""
    from course_utils.ledger import autocast_rules, fake_mode
    shape = dict(layers=1, hidden=40, heads=2, vocab=1000, seq=24, batch=2)
    kept = {}
    for device_type in ("cpu", "cuda"):
        with fake_mode(), torch.device(device_type):
            model = TinyGPT(1000, 24, 1, 40, 2)
            tokens = torch.randint(1000, (2, 24))
            with autocast_rules(device_type):
                loss = model.loss(tokens, tokens)
        nll = loss.grad_fn
        while nll.name() != "NllLossBackward0":
            nll = nll.next_functions[0][0]
        log_softmax = nll.next_functions[0][0]
        while log_softmax.name() != "LogSoftmaxBackward0":
            log_softmax = log_softmax.next_functions[0][0]
        kept[device_type] = (log_softmax._saved_result, nll._saved_self)
    cpu_out, cpu_nll = kept["cpu"]
    cuda_out, cuda_nll = kept["cuda"]
    assert cpu_out.dtype == cpu_nll.dtype == torch.float32
    assert cpu_out.untyped_storage()._cdata == cpu_nll.untyped_storage()._cdata   # one tensor
    assert (cuda_out.dtype, cuda_nll.dtype) == (torch.bfloat16, torch.float32)
    assert cuda_out.untyped_storage()._cdata != cuda_nll.untyped_storage()._cdata
    for device_type in ("cpu", "cuda"):   # the per-sample formula, logits term included on CUDA
        slope = _fake_kept(device_type, {**shape, "batch": 4}) - _fake_kept(device_type, shape)
        assert slope == (M.tinygpt_activation_bytes(1, 40, 2, 1000, 24, 4, autocast=device_type)
                         - M.tinygpt_activation_bytes(1, 40, 2, 1000, 24, 2, autocast=device_type))
