"""Ledger accuracy: predicted / measured for every ledger line, over models and batch sizes.

A ratio of exactly 1.0 means the analytic rules (``course_utils.ledger.predict_step``) account for
every FLOP PyTorch counts and every byte autograd saves.
"""
from __future__ import annotations

import torch

from course_utils.ledger import LEDGER_LINES, measure, predict_step
from course_utils.models import MLP, SmallResNet
from course_utils.objectives import Supervised, make_step
from course_utils.optim import make_optimizer

LEARNING_RATES = {"sgd": 0.1, "sgd-momentum": 0.1, "adam": 1e-3}  # names in course_utils.optim


def configurations(quick: bool):
    image = 16 if quick else 32
    models = {
        "mlp-2x64": lambda: MLP(3 * image * image, 64, 8, layers=2),
        "mlp-4x256": lambda: MLP(3 * image * image, 256, 8, layers=4),
        "resnet-w8": lambda: SmallResNet(width=8, num_classes=8),
        "resnet-w16-222": lambda: SmallResNet(width=16, blocks=(2, 2, 2), num_classes=8),
    }
    batches = (4, 16) if quick else (8, 32, 128)
    for name, make in models.items():
        for batch in batches:
            for opt in ("sgd", "adam") if quick else LEARNING_RATES:
                yield name, make, batch, opt, image


def run(quick: bool = False) -> dict:
    rows = []
    for name, make, batch, opt_name, image in configurations(quick):
        torch.manual_seed(0)
        model = make()
        opt = make_optimizer(opt_name, model.parameters(), lr=LEARNING_RATES[opt_name])
        x, y = torch.rand(batch, 3, image, image), torch.randint(0, 8, (batch,))
        step = make_step(Supervised(model), opt)
        measured = measure(lambda: step((x, y)), model=model, optimizer=opt)
        predicted = predict_step(model, x.shape, optimizer=opt_name)
        ratios = {line: (predicted[line] / getattr(measured, line) if getattr(measured, line) else
                         float(predicted[line] == 0))
                  for line in LEDGER_LINES if line in predicted}
        rows.append({"model": name, "batch": batch, "optimizer": opt_name, "image_size": image,
                     "predicted_over_measured": ratios})
    worst = max(abs(r - 1) for row in rows for r in row["predicted_over_measured"].values())
    return {"configurations": rows,
            "summary": {"configurations": len(rows), "worst_abs(ratio-1)": worst}}


if __name__ == "__main__":
    import json
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from run import run_one
    print(json.dumps(run_one(Path(__file__), quick="--quick" in sys.argv)["summary"], indent=1))
