"""Exercise feedback coaches without revealing (course_utils.exercises).

1. A failing ``check_close`` / ``check_equal`` says in which direction and by what factor the
   answer misses (for a tensor, where), and never spells the expected value, in any of the usual
   formats; nor does ``Exercises.check``'s feedback (a failing ``assert left == right`` shows the
   side computed from the answer only).
2. Wrong answers that learners plausibly write fail at least one *public* check (the one the
   student edition runs), for several students' configurations, while the reference solution
   passes them: the public tests are read from ``course_utils/practice_data`` and run on the
   lesson's own exercise set-up cells (the ``task`` and the helpers the tests call).
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.exercises import check_close, check_equal, describe_miss
from course_utils.exercises import Exercises, load_lesson

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- no expected value

def spellings(value) -> set[str]:
    """The ways a message could spell ``value``: repr, thousands separators, :g and :.6g."""
    if isinstance(value, str):
        return {value, repr(value)}
    out = {repr(value), f"{value:,}", f"{value:g}", f"{value:.6g}"}
    if isinstance(value, float) and value.is_integer():
        out |= {str(int(value)), f"{int(value):,}"}
    return out


def spells(message: str, value) -> list[str]:
    """The spellings of ``value`` that occur in ``message`` as a whole number (not as the digits
    of a longer one: "3" does not occur in "33.3%", "1" not in "1e-09")."""
    found = []
    for s in spellings(value):
        if isinstance(value, str):
            if s in message:
                found.append(s)
        elif re.search(r"(?<![\d.,])" + re.escape(s) + r"(?![.,]?\d|e[-+]?\d)", message):
            found.append(s)
    return found


def failure(fn, *args, **kwargs) -> str:
    with pytest.raises(AssertionError) as err:
        fn(*args, **kwargs)
    return str(err.value)


CLOSE_CASES = [  # (answer, expected, kwargs, what the message must say)
    (49152, 196608, dict(rtol=0), "2–5× too small"),
    (225_000, 200_000, dict(rtol=0), "10–25% too large"),
    (2, 3, dict(rtol=0), "too small"),
    (307_200, 1.2288e6, dict(rtol=0), "2–5× too small"),
    (0.2, 0.123456789, dict(rtol=1e-6), "too large"),
    (1.0000001, 1.0000000005, dict(rtol=1e-9), "too large"),
    (-2.0, -8.75, dict(rtol=1e-6), "magnitude is 2–5× too small"),
    (5.5, -8.75, dict(rtol=1e-6), "wrong sign"),
    (0.5, 1234.5678, dict(rtol=0.1, atol=1.0), "too small"),
]


@pytest.mark.parametrize("answer, expected, kwargs, says", CLOSE_CASES)
def test_check_close_says_direction_and_factor_never_the_expected_value(answer, expected, kwargs, says):
    message = failure(check_close, answer, expected, what="the quantity", **kwargs)
    assert says in message, message
    assert not spells(message, expected), f"{message!r} spells the expected {expected!r}"
    assert message.startswith("the quantity: your answer"), message


def test_check_close_on_a_tensor_names_the_worst_element_and_its_direction():
    got = torch.tensor([[1.5, 130.0], [7.75, 9.25]])
    want = torch.tensor([[1.5, 123.456], [7.75, 21.125]])
    message = failure(check_close, got, want, rtol=1e-3, what="v")
    assert "element [1, 1]" in message and "2–5× too small" in message, message
    assert "2 of 4 elements" in message, message
    for w in (123.456, 21.125):
        assert not spells(message, w), (message, w)
    # a shape is structural: stated
    assert "expected shape (3,), got shape (2,)" in failure(check_close, torch.ones(2), torch.ones(3), what="v")


def test_check_close_never_shows_a_non_numeric_expected_value():
    message = failure(check_close, 12, "a secret answer", what="count")
    assert "secret" not in message and "expected value" in message


EQUAL_CASES = [  # (answer, expected, what the message must say)
    (4, 3, "too large"),
    (12_007, 16_000, "10–25% too small"),
    (0.5, 0.625, "10–25% too small"),
    ((3, 7), (3, 9), "your answer[1] 7 is"),
    ([3, 7], (3, 7), "is a list, the check expects a tuple"),
    ([5, 10, 15], [5, 10], "has 3 item(s)"),
    ("adam", "sgd-momentum", "'adam' is not what the check expects"),
    ([True, True], [True, False], "your answer[1] True"),
    ({"none": 3, "full": 9}, {"none": 3, "full": 12}, "your answer['full'] 9"),
    ({"none": 3}, {"none": 3, "full": 12}, "lacks the key(s) ['full']"),
    (torch.tensor([40, 5, 6]), torch.tensor([41, 5, 6]), "at [0]"),
    (torch.tensor([True, False, True]), torch.tensor([True, True, True]), "first at [1]"),
]


@pytest.mark.parametrize("answer, expected, says", EQUAL_CASES, ids=lambda v: repr(v)[:30])
def test_check_equal_says_how_it_differs_never_the_expected_value(answer, expected, says):
    message = failure(check_equal, answer, expected, what="the thing")
    assert says in message, message
    if not isinstance(expected, (int, float)):
        assert repr(expected) not in message and str(expected) not in message, message
    leaves = expected.values() if isinstance(expected, dict) else \
        expected.tolist() if isinstance(expected, torch.Tensor) else \
        expected if isinstance(expected, (list, tuple)) else [expected]
    mine = answer.values() if isinstance(answer, dict) else \
        answer.tolist() if isinstance(answer, torch.Tensor) else \
        answer if isinstance(answer, (list, tuple)) else [answer]
    for leaf in leaves:   # an item the answer has right may be shown: it is the answer's own
        if leaf not in list(mine) and not isinstance(leaf, bool):
            assert not spells(message, leaf), (message, leaf)


def test_equal_things_pass():
    check_equal(3, 3.0, what="x")
    check_equal((1, [2, "a"]), (1, [2, "a"]), what="x")
    check_equal({"a": torch.tensor([1, 2])}, {"a": torch.tensor([1, 2])}, what="x")
    check_close(torch.tensor([1.0, 2.0]), [1.0, 2.0 + 1e-9], rtol=1e-6, what="x")


def test_describe_miss_wording():
    assert describe_miss(49152, 196608, "allowed: rtol=0") == "2–5× too small (allowed: rtol=0)"
    assert describe_miss(225, 200) == "10–25% too large"
    assert describe_miss(0.5, 0.0) == "too large"


# --------------------------------------------------------------------------- practice feedback

QUESTION = {
    "answer_names": ["state_bytes", "optimizer_name", "fits"],
    "public_tests": [
        'assert state_bytes(1000) == 16 * 1000, "weights, gradients and two moments, 4 bytes each"',
        'check_close(state_bytes(3), 48, rtol=0, what="three parameters")',
        'assert optimizer_name == "adamw", "the optimizer with decoupled weight decay"',
        '_n = state_bytes(5)\nassert _n <= 4 * 20, f"{_n} bytes is more than the budget"',
        'assert [state_bytes(1), state_bytes(2)] == [16, 32]',
        'for _k in (7, 9):\n    check_equal(state_bytes(_k), 16 * _k, what=f"{_k} parameters")',
        'assert fits == {"none": 6, "full": 24}',
    ],
    "solution": "def state_bytes(n):\n    return 16 * n\noptimizer_name = 'adamw'\n"
                "fits = {'none': 6, 'full': 24}",
}
EXPECTED = [16_000, 48, "adamw", 16, 32, 112, 144, 24]


def practice(answer_src: str):
    ex = Exercises("01_resource_ledger")
    ex.questions = {**ex.questions, "q_demo": QUESTION}
    ns = {"check_close": check_close, "check_equal": check_equal}
    exec(answer_src, ns)
    return ex.check("q_demo", ns)


def test_practice_feedback_never_spells_the_expected_value():
    result = practice("def state_bytes(n):\n    return 20 * n + 7\noptimizer_name = 'adam'\n"
                      "fits = {'none': 6, 'full': 20}")
    shown = repr(result)
    assert result.status == "failed" and result.passed == 0 and result.total == 7, shown
    for value in EXPECTED:
        assert not spells(shown, value), f"feedback spells {value!r}:\n{shown}"
    assert "yours: state_bytes(1000) = 20,007: 25–50% too large" in shown, shown
    assert "hint: weights, gradients and two moments" in shown
    assert "check_close(state_bytes(3), …)" in shown and "three parameters: your answer 67" in shown
    assert "yours: optimizer_name = 'adam'" in shown
    assert "it should be <= 4 * 20" in shown and "hint: 107 bytes is more than the budget" in shown
    assert "your answer[0] 27 is 50–100% too large" in shown
    assert "your answer['full'] 20 is 10–25% too small" in shown
    assert 'exercises.reveal("q_demo")' in shown


def test_practice_passes_the_solution():
    result = practice(QUESTION["solution"])
    assert result.status == "passed", repr(result)


# --------------------------------------------------------------------------- wrong forms

STUDENTS = ["", "ada", "grace hopper", "student042", "Alan Turing"]

LESSON_IMPORTS = dict(torch=torch, math=math, nn=nn, F=F, check_close=check_close,
                      check_equal=check_equal)


def exercise_namespace(lesson: str, student: str) -> dict:
    """The lesson's exercise set-up cells (``task`` and the helpers its tests call), run for
    ``student``, on the imports they use."""
    from course_utils.objectives import MoCo
    from course_utils.objectives.moco import FeatureQueue
    from course_utils.objectives.simclr import nt_xent_loss
    nb = json.loads((ROOT / "notebooks" / f"{lesson}.ipynb").read_text())
    text = ["".join(c["source"]) for c in nb["cells"]]
    start = next(i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"
                 and text[i].startswith("## Exercises"))
    stop = next(i for i in range(start, len(text)) if "BEGIN QUESTION" in text[i])
    from course_utils.distributed import pipeline
    from course_utils.models import ViT
    ns = {**LESSON_IMPORTS, "STUDENT_ID": student, "MoCo": MoCo, "FeatureQueue": FeatureQueue,
          "nt_xent_loss": nt_xent_loss, "device": torch.device("cpu"), "pipeline": pipeline, "ViT": ViT}
    for i in range(start, stop):
        if nb["cells"][i]["cell_type"] == "code":
            exec(text[i], ns)
    return ns


def _from_solution(lesson: str, question: str, *edits: tuple[str, str]) -> str:
    """A wrong form made from the shipped solution by text edits (each must apply), so it tracks
    the solution instead of restating it."""
    source = load_lesson(lesson)["questions"][question]["solution"]
    for old, new in edits:
        assert old in source, f"{lesson} {question}: the solution no longer has {old!r}"
        source = source.replace(old, new)
    return source


_ALL_ANCHORS = "(negatives - sims[torch.arange(2 * n), positive]).mean()"
DECOUPLED_ONE_DIRECTION = _from_solution(  # z1's anchors only
    "02_simclr", "q2_decoupled_loss",
    (_ALL_ANCHORS, "(negatives - sims[torch.arange(2 * n), positive])[:n].mean()"))
DECOUPLED_UNNORMALISED = _from_solution(
    "02_simclr", "q2_decoupled_loss",
    ("F.normalize(torch.cat([z1, z2]), dim=1)", "torch.cat([z1, z2])"))

WRONG_FORMS = [  # (lesson, question, what, wrong answer cell)
    ("02_simclr", "q2_decoupled_loss", "anchors of one view only", DECOUPLED_ONE_DIRECTION),
    ("02_simclr", "q2_decoupled_loss", "no L2 normalisation", DECOUPLED_UNNORMALISED),
    ("03_moco", "q2_batch_for_fresh_keys", "floor instead of ceiling",
     "def smallest_batch(queue_size, max_age):\n    return queue_size // max_age"),
    ("03_moco", "q3_key_encoder_half_life", "round() instead of ceil()",
     "def updates_to_close_half(m):\n    return round(math.log(0.5) / math.log(m))"),
    ("03_moco", "q3_key_encoder_half_life", "the time constant ln 2 / (1 − m)",
     "def updates_to_close_half(m):\n    return int(math.log(2) / (1 - m))"),
    # found by a cold review: each passed every public check for some students
    ("03_moco", "q2_batch_for_fresh_keys", "one more than floor",
     "def smallest_batch(queue_size, max_age):\n    return queue_size // max_age + 1"),
    ("03_moco", "q3_key_encoder_half_life", "the time constant rounded up",
     "def updates_to_close_half(m):\n    return math.ceil(math.log(2) / (1 - m))"),
    ("04_mae", "q2_visible_tokens_for_flop_share", "linear in the tokens (no attention term)",
     "def max_visible_tokens(length, dim, share):\n    return max(1, int(share * length))"),
    ("09_pipeline_tensor_parallel", "q2_peak_activations", "p - s whatever m",
     "def peak_activations_1f1b(p, m):\n    return [p - s for s in range(p)]"),
    ("13_no_negatives", "q1_partial_collapse", "the population std (N, not N − 1)",
     "def predicted_effective_rank(k, d, m):\n    return float(k)\n"
     "def predicted_std(k, d, m):\n    return k * math.sqrt((1 / k) * (1 - 1 / k)) / d"),
    ("13_no_negatives", "q1_partial_collapse", "the mean over the k used dimensions only",
     "def predicted_effective_rank(k, d, m):\n    return float(k)\n"
     "def predicted_std(k, d, m):\n    n = k * m\n"
     "    return math.sqrt((m * (1 - 1 / k) ** 2 + (n - m) / k ** 2) / (n - 1))"),
    ("13_no_negatives", "q2_uniformity_of_clusters", "every ordered pair, each row with itself too",
     "def predicted_uniformity(k, m, t):\n    n = k * m\n"
     "    return math.log((k * m * m + (n * n - k * m * m) * math.exp(-2 * t)) / (n * n))\n"
     "more_directions_more_uniform = True"),
    ("13_no_negatives", "q2_uniformity_of_clusters", "a right formula, the wrong prediction",
     "def predicted_uniformity(k, m, t):\n    n = k * m\n    pairs = n * (n - 1) / 2\n"
     "    same = k * m * (m - 1) / 2\n"
     "    return math.log((same + (pairs - same) * math.exp(-2 * t)) / pairs)\n"
     "more_directions_more_uniform = False"),
]


def check_answer(lesson: str, question: str, student: str, answer_src: str):
    ns = exercise_namespace(lesson, student)
    exec(answer_src, ns)
    return Exercises(lesson).check(question, ns)


@pytest.mark.parametrize("lesson, question, what, wrong", WRONG_FORMS,
                         ids=[f"{q}-{w}" for _, q, w, _ in WRONG_FORMS])
def test_a_plausible_wrong_form_fails_a_public_check(lesson, question, what, wrong):
    assert any(v for v in load_lesson(lesson)["questions"][question]["public_tests"]), question
    for student in STUDENTS:
        result = check_answer(lesson, question, student, wrong)
        assert result.status == "failed", \
            f"{lesson} {question}, {what}, student {student!r}: passes the public checks\n{result!r}"


@pytest.mark.parametrize("lesson, question", sorted({(l, q) for l, q, _, _ in WRONG_FORMS}))
def test_the_reference_solution_passes_those_public_checks(lesson, question):
    solution = load_lesson(lesson)["questions"][question]["solution"]
    for student in STUDENTS:
        result = check_answer(lesson, question, student, solution)
        assert result.status == "passed", f"{lesson} {question}, student {student!r}:\n{result!r}"


def test_probing_with_a_small_answer_does_not_reveal_the_value():
    """With the answer beside it, an exact factor would give the expected value away: answering
    1 must not print 69 (or 6.9, 69×) for an expected 69."""
    for expected in (69, 4, 777, 123456):  # (not a band edge: "over 1000×" is a band)
        message = failure(check_close, 1, expected, rtol=0, what="q")
        assert not spells(message, expected) and str(expected) not in message.split("answer 1 is")[1], message
