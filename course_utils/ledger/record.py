"""The ledger's record of one step, and its line-by-line comparison with a prediction.

``LEDGER_LINES`` are the integer lines every record carries (and a prediction may name):
flops = forward_flops + backward_flops; recomputed_flops (the "repeated" line: forward FLOPs run
again inside backward, part of backward_flops; ``re_encoded`` adds the items an encoder encoded
twice in the step); activation_bytes (kept for backward); param_bytes, grad_bytes,
optimizer_bytes, cache_bytes (resident state); comm_bytes ("communicated": bytes this rank sends
per step under ring algorithms, 0 without a process group; ``comm`` breaks it down per
collective kind).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..report import format_table, quantity

LEDGER_LINES = ("flops", "forward_flops", "backward_flops", "recomputed_flops", "activation_bytes",
                "param_bytes", "grad_bytes", "optimizer_bytes", "cache_bytes", "comm_bytes")


# each field's line of the ledger (lesson 01's table), as a printed record names it
LINE_NAMES = {"flops": "compute", "forward_flops": "compute: forward",
              "backward_flops": "compute: backward", "recomputed_flops": "repeated",
              "activation_bytes": "kept for backward", "param_bytes": "resident state",
              "grad_bytes": "resident state", "optimizer_bytes": "resident state",
              "cache_bytes": "cached", "comm_bytes": "communicated", "comm": "communicated",
              "encoded": "encoded now", "re-encoded": "repeated"}


@dataclass
class LedgerRecord:
    flops: int
    forward_flops: int
    backward_flops: int
    activation_bytes: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    cache_bytes: int
    comm_bytes: int = 0
    recomputed_flops: int = 0   # the repeated line: forward FLOPs re-run in backward
    re_encoded: dict = field(default_factory=dict)   # encoder -> items encoded twice this step
    comm: dict = field(default_factory=dict)  # kind -> {"calls", "payload_bytes", "sent_bytes"}
    wire_bytes: int | None = None   # written to sockets during the step (gloo on Linux)
    world_size: int = 1
    fake: bool = False          # measured on fake tensors: no values, no peak reading
    encoded: dict = field(default_factory=dict)
    saved_tensors: int = 0
    peak_bytes: int | None = None
    device: str = "cpu"
    notes: str = ""

    @property
    def resident_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.cache_bytes

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in LEDGER_LINES}
        d.update(resident_bytes=self.resident_bytes, peak_bytes=self.peak_bytes,
                 encoded=dict(self.encoded), re_encoded=dict(self.re_encoded), device=self.device, comm=dict(self.comm), wire_bytes=self.wire_bytes,
                 world_size=self.world_size, fake=self.fake)
        return d

    def rows(self) -> list[dict]:
        rows = [{"line": k, "measured": getattr(self, k)} for k in LEDGER_LINES]
        rows += [{"line": f"comm: {k} ({c['calls']} calls)", "measured": c["sent_bytes"]}
                 for k, c in self.comm.items()]
        rows += [{"line": f"encoded: {k}", "measured": v} for k, v in self.encoded.items()]
        rows += [{"line": f"re-encoded: {k}", "measured": v} for k, v in self.re_encoded.items()]
        rows.append({"line": "peak_bytes (CUDA)",
                     "measured": "not measured on CPU" if self.peak_bytes is None else self.peak_bytes})
        return rows

    def __str__(self) -> str:
        """The record as a reader sees it: each field beside its ledger line, in units."""
        def shown(line, value):
            if line.startswith("comm:"):
                return quantity(value, "B")
            if isinstance(value, str) or line not in LEDGER_LINES:
                return value
            return quantity(value, "FLOP" if line.endswith("flops") else "B")
        rows = [{"ledger line": LINE_NAMES.get(r["line"].split(":")[0], ""), "field": r["line"],
                 "measured": shown(r["line"], r["measured"])} for r in self.rows()]
        return format_table(rows) + (f"\n{self.notes}" if self.notes else "")

    def compare(self, prediction: dict) -> "Comparison":
        """Line-by-line comparison with an analytic prediction (keys = ledger line names)."""
        unknown = set(prediction) - set(LEDGER_LINES)
        if unknown:
            raise ValueError(f"prediction has unknown ledger lines {sorted(unknown)}; "
                             f"use names from {LEDGER_LINES}")
        return Comparison([(k, int(prediction[k]), getattr(self, k)) for k in LEDGER_LINES
                           if k in prediction])


@dataclass
class Comparison:
    lines: list  # (name, predicted, measured)

    def rows(self) -> list[dict]:
        return [{"line": n, "predicted": p, "measured": m,
                 "measured/predicted": (m / p if p else (1.0 if m == 0 else float("inf")))}
                for n, p, m in self.lines]

    def max_relative_error(self) -> float:
        errs = [abs(m - p) / max(abs(p), 1) for _, p, m in self.lines]
        return max(errs, default=0.0)

    def assert_close(self, rtol: float = 0.01) -> None:
        bad = [(n, p, m) for n, p, m in self.lines if abs(m - p) > rtol * max(abs(p), 1)]
        if bad:
            detail = "; ".join(f"{n}: predicted {p:,} measured {m:,}" for n, p, m in bad)
            raise AssertionError(f"ledger prediction off by more than {rtol:.1%}: {detail}")

    def __str__(self) -> str:
        return format_table(self.rows())
