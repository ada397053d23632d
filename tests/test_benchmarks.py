"""The benchmark runner works; the ledger benchmark's ratios are exactly 1 (the analytic rules
account for every FLOP and saved byte)."""
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ledger_benchmark_quick():
    result = load("bench_ledger").run(quick=True)
    assert result["summary"]["configurations"] >= 8
    assert result["summary"]["worst_abs(ratio-1)"] == 0.0
