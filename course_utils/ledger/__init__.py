"""The resource ledger of one training step: measured, and predicted by hand.

    record.py           LedgerRecord (one step's lines), Comparison (predicted vs measured)
    measured.py         measure(step, model=, optimizer=, caches=, encoders=): FLOPs split
                        forward/backward, bytes kept for backward, resident state, items encoded;
                        kept_after_forward: the kept bytes of a forward alone
    fake.py             fake_mode, fake_world: the same measurement on fake tensors and a fake
                        process group (any model size, any number of ranks, in one process);
                        peak_live_bytes: every live tensor at the step's peak, by category;
                        autocast_rules: a device's autocast rules where it is absent (fake CUDA)
    cuda.py             cuda_peak_bytes, record_memory_snapshot: the CUDA allocator's view
    speed.py            peak_flops (measured once per device and thread count, cached; re-measured when a step beats it), utilisation / step_utilisation: achieved FLOP/s and MFU
    predicted.py        predict_step: the same lines from shapes and per-layer rules
    comm_count.py       CollectiveCounter, allreduce_mean_hook, ring_factor: the bytes a rank
                        hands to collectives (the "communicated" line)

Import from the package, e.g. ``from course_utils.ledger import measure, predict_step``. The
ledger stands on torch and the kit's ground modules (checks, optim, report) only: what uses it
(lesson 06's TinyGPT measurements, the paper-scale planner) is in ``course_utils.experiments``.
"""
from .cuda import cuda_peak_bytes, record_memory_snapshot
from .fake import autocast_rules, fake_mode, fake_world, is_fake, peak_live_bytes
from .measured import kept_after_forward, measure, optimizer_state_tensors, resident_bytes
from .predicted import predict_step
from .speed import peak_flops, step_utilisation, utilisation
from .record import LEDGER_LINES, Comparison, LedgerRecord

__all__ = ["LEDGER_LINES", "Comparison", "LedgerRecord", "autocast_rules", "cuda_peak_bytes",
           "fake_mode", "fake_world", "is_fake", "kept_after_forward", "measure",
           "optimizer_state_tensors", "peak_flops", "peak_live_bytes", "predict_step",
           "record_memory_snapshot", "resident_bytes", "step_utilisation", "utilisation"]
