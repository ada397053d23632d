"""Device bugs caught on a CPU-only machine (issue 26, item 3): ``COURSE_CHECK_PLACEMENT=1`` makes
``runtime.setup`` tell host tensors from device tensors (``course_utils.distributed.device_check``),
so what would raise on a GPU raises here. ``make test`` sets it, so every lesson's nbval run is
checked this way; these tests plant the bugs it exists for and show each one raises, and that the
correct versions of the same lines do not (the world where the check is blind or cries wolf).

What it cannot see (see the module docstring): code that runs only when ``device.type == "cuda"``,
tensors torch makes in C++, and a GPU's speed or memory.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = """
import json, sys, tempfile
import torch, torch.nn as nn
from course_utils import checkpoint as ck
from course_utils.runtime import setup
from course_utils.distributed.device_check import PlacementError
device = setup("ci", seed=0)
results = {}
def case(name, fn):
    try:
        fn()
        results[name] = "ran"
    except PlacementError as err:
        results[name] = "PlacementError: " + str(err)
"""

CASES = """
model = nn.Linear(4, 2).to(device)
batch = torch.randn(3, 4)                       # never moved
case("model moved, batch not", lambda: model(batch))
case("model and batch moved", lambda: model(batch.to(device)))

path = tempfile.mkdtemp() + "/last.pt"
ck.save(path, {"model": model.state_dict()})
saved = ck.load(path)["model"]                  # map_location="cpu": on the host
case("CPU checkpoint vs live weights (lesson 10's bug)",
     lambda: torch.equal(saved["weight"], model.state_dict()["weight"]))
case("CPU checkpoint vs weights moved to the CPU",
     lambda: torch.equal(saved["weight"], model.state_dict()["weight"].cpu()))

unmoved = nn.Linear(4, 2)
case("model not moved, batch moved", lambda: unmoved(batch.to(device)))
case("all on the host", lambda: unmoved(batch))
z = torch.randn(3, 2)
case("to(x.device) follows x", lambda: z[:, 0] + torch.arange(3).to(z.device))
case("a 0-d host scalar with a device tensor", lambda: model.weight * torch.tensor(2.0))
from course_utils.data import load_dataset
images = load_dataset("shapes", "train", image_size=8, device=device, limit=4).images
probe = lambda: nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 2)).double()
case("data loaded to the device, fp64 model left on the host (lesson 02's bug)",
     lambda: probe()(images.double()))
case("data loaded to the device, fp64 model moved", lambda: probe().to(device)(images.double()))
print("RESULTS " + json.dumps(results))
"""


def _run(check: bool) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COURSE_CHECK_PLACEMENT": "1" if check else "0"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(PRELUDE) + textwrap.dedent(CASES)],
                          capture_output=True, text=True, env=env, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):]), proc.stdout


@pytest.fixture(scope="module")
def checked():
    results, stdout = _run(check=True)
    assert "COURSE_CHECK_PLACEMENT=1: host and device tensors are told apart" in stdout
    return results


@pytest.mark.parametrize("bug", ["model moved, batch not",
                                 "CPU checkpoint vs live weights (lesson 10's bug)",
                                 "model not moved, batch moved",
                                 "data loaded to the device, fp64 model left on the host (lesson 02's bug)"])
def test_a_planted_device_bug_raises(checked, bug):
    assert checked[bug].startswith("PlacementError: ") and "mixes a host tensor" in checked[bug], checked[bug]


@pytest.mark.parametrize("fine", ["model and batch moved", "CPU checkpoint vs weights moved to the CPU",
                                  "all on the host", "to(x.device) follows x",
                                  "a 0-d host scalar with a device tensor",
                                  "data loaded to the device, fp64 model moved"])
def test_the_correct_line_runs(checked, fine):
    assert checked[fine] == "ran", checked[fine]


def test_the_check_is_off_unless_asked():
    unchecked, stdout = _run(check=False)
    assert "told apart" not in stdout
    assert set(unchecked.values()) == {"ran"}, unchecked   # the same bugs pass silently on a CPU


def test_make_test_runs_the_lessons_under_the_check():
    makefile = (ROOT / "Makefile").read_text()
    test_recipe = makefile[makefile.index("\ntest:"):].split("\n\n")[0]
    assert "COURSE_CHECK_PLACEMENT=1" in test_recipe
