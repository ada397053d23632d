"""The trusted side of grading, without a sandbox (milliseconds): what crosses from a submission is
plain data, checked against the kind its answer cell declares; IDs and file names; the results
record kept to the zip's questions. tests/test_grading_sandbox.py grades the attacks end to end."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import grade  # noqa: E402
import plain  # noqa: E402
from grade_stages import declared_answers  # noqa: E402


def roundtrip(value):
    return plain.loads(plain.dumps(value))


def test_plain_data_round_trips_with_its_types():
    value = {"a": [1, 2.5, (3, "x")], 4: None, "nan": math.nan, "dots": ..., "t": True}
    back = roundtrip(value)
    assert back["a"] == [1, 2.5, (3, "x")] and type(back["a"][2]) is tuple
    assert math.isnan(back["nan"]) and back["dots"] is ... and back[4] is None
    t = roundtrip(torch.arange(6, dtype=torch.float16).reshape(2, 3))
    assert type(t) is torch.Tensor and t.dtype == torch.float16 and t.shape == (2, 3)


def test_a_tensor_subclass_crosses_as_a_plain_tensor():
    class Liar(torch.Tensor):
        pass
    back = roundtrip(torch.ones(3).as_subclass(Liar))
    assert type(back) is torch.Tensor and back.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("data, why", [
    ({"ref": ["unittest.mock", "ANY"]}, "unknown form"),
    ({"module": "os"}, "unknown form"),
    ({"list": [1], "extra": 2}, "unexpected dict"),
    ({"tensor": {"dtype": "object", "shape": [1], "data": [1]}}, "dtype"),
    ({"tensor": {"dtype": "float32", "shape": [3], "data": [1, 2]}}, "prod"),
    ({"tensor": {"dtype": "float32", "shape": [1], "data": ["x"]}}, "numbers"),
    ({"dict": [[{"list": []}, 1]]}, "keys"),
    ("x" * (plain.MAX_STRING + 1), "longer"),
])
def test_anything_else_is_refused_with_a_reason(data, why):
    with pytest.raises(plain.NotPlainData, match=why):
        plain.decode(data)


def test_deep_or_huge_input_is_refused_not_a_crash():
    with pytest.raises(plain.NotPlainData, match="deep"):
        plain.loads("[" * 100_000 + "]" * 100_000)
    nested = 1
    for _ in range(plain.MAX_DEPTH + 2):
        nested = {"list": [nested]}
    with pytest.raises(plain.NotPlainData, match="deeper"):
        plain.decode(nested)
    with pytest.raises(plain.NotPlainData, match="NaN"):
        plain.parse_json("NaN")
    with pytest.raises(plain.NotPlainData):
        plain.encode(object())


def test_answers_are_held_to_their_declared_kind():
    declared = {**declared_answers("ratio = ...\n"), **declared_answers("def f(x):\n    ...\n")}
    assert declared == {"ratio": "value", "f": "function"}
    claim = {"values": {"f": 3}, "functions": {"ratio": {"source": "def ratio(_=print()): 0",
                                                         "helpers": {}}}}
    values, functions, notes = grade.check_answers(claim, declared)
    assert values == {} and functions == {}
    assert any("should be a value" in n for n in notes)
    assert any("should be a function" in n for n in notes)
    values, functions, notes = grade.check_answers(
        {"values": {"ratio": {"ref": ["unittest.mock", "ANY"]}}, "refused": {"f": "a Model"}},
        declared)
    assert values == {} and len(notes) == 2 and "not plain data" in notes[1]
    values, _, notes = grade.check_answers({"values": {"ratio": {"float": "nan"}}}, declared)
    assert values == {"ratio": {"float": "nan"}}
    assert grade.check_answers("garbage", declared)[2][0].endswith("is not defined in the submission")


def test_the_record_cannot_add_questions_or_points():
    points = {"q1": 1.0, "q2": 2.0}
    raw = {"tests": [{"name": "q1", "score": 100, "max_score": 100},
                     {"name": "q9_bonus", "score": 5, "max_score": 5},
                     {"name": "Public Tests", "output": "x"}, "junk"]}
    scores, tests = grade.results_of(raw, points)
    assert scores == {"q1": (1.0, 1.0), "q2": (0.0, 2.0)}
    assert [t["name"] for t in tests] == ["Public Tests", "q1", "q2"]
    assert grade.results_of({"tests": [{"name": "q1", "score": -3}]}, points)[0]["q1"] == (0.0, 1.0)


@pytest.mark.parametrize("stem, want", [("alice", "alice"), ("Alice", "alice"),
                                        ("ａｌｉｃｅ", "alice"), ("bob_2.x-y", "bob_2.x-y")])
def test_ids_are_normalised(stem, want):
    assert grade.student_id(stem) == want


@pytest.mark.parametrize("stem", [" ", "", "alicе", "a b", "../x", "-a", "x" * 65, "\udcff"])
def test_look_alike_and_unsafe_ids_are_refused(stem):
    with pytest.raises(grade.NotGraded, match="not a student ID"):
        grade.student_id(stem)


def test_a_folder_lists_every_file_with_its_problem(tmp_path):
    for name in ("Dup.ipynb", "dup.ZIP", "ok.IPYNB", " .ipynb", "notes.txt"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "link.ipynb").symlink_to(tmp_path / "ok.IPYNB")
    (tmp_path / "dir.ipynb").mkdir()
    got = {s.name: (s.student, s.problem) for s in grade.submissions(tmp_path)}
    assert set(got) == {"Dup.ipynb", "dup.ZIP", "ok.IPYNB", " .ipynb", "link.ipynb", "dir.ipynb"}
    assert got["ok.IPYNB"] == ("ok", "")
    assert "2 files for student 'dup'" in got["Dup.ipynb"][1] == got["dup.ZIP"][1]
    assert "symbolic link" in got["link.ipynb"][1] and "regular" in got["dir.ipynb"][1]
    assert got[" .ipynb"][0] is None and "not a student ID" in got[" .ipynb"][1]


def test_a_zip_submission_that_cannot_be_read_says_why(tmp_path):
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a.ipynb", "{}")
        z.writestr("b.ipynb", "{}")
    (tmp_path / "two.zip").write_bytes(buf.getvalue())
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(grade.NotGraded, match="exactly one notebook"):
        grade.read_submission(tmp_path / "two.zip")
    with pytest.raises(grade.NotGraded, match="not a readable zip"):
        grade.read_submission(tmp_path / "bad.zip")
    assert json.loads(grade._notebook_in_zip(_one_zip())) == {"cells": []}


def _one_zip() -> bytes:
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.ipynb", '{"cells": []}')
    return buf.getvalue()


@pytest.mark.parametrize("answer, expected", [
    (torch.tensor(True), 12), (torch.ones(3, dtype=torch.bool), torch.tensor([5, 9, 2])),
    (True, 1), ([True, True], [1, 2]), ((torch.tensor(True), torch.tensor(True)), (3, 4)),
])
def test_booleans_are_not_any_nonzero_number(answer, expected):
    """A graded function can return booleans (plain data carries them faithfully): the checks
    must not compare them as "non-zero" (a bool tensor used to pass check_equal against 49152)."""
    from course_utils.exercises import check_close, check_equal
    back = roundtrip(answer)
    with pytest.raises(AssertionError):
        check_equal(back, expected, what="x")
    if not isinstance(back, tuple):
        with pytest.raises(AssertionError):
            check_close(back, expected, what="x")


def test_names_and_reasons_cannot_drive_a_terminal_or_a_spreadsheet(tmp_path):
    name = "\x1b[1A\x1b[2K\rcarol.ipynb: ok\n.ipynb"
    (tmp_path / name).write_text("{}")
    (tmp_path / "=HYPERLINK(1).ipynb").write_text("{}")
    shown = {s.name for s in grade.submissions(tmp_path)}
    assert "\\x1b[1A\\x1b[2K\\x0dcarol.ipynb: ok\\n.ipynb" in shown
    assert all(not any(ord(c) < 32 for c in n) for n in shown)
    grade.write_csv(tmp_path / "s.csv", [("=HYPERLINK(1).ipynb", grade.failed(
        "error", "=cmd|' /C calc'!A0", {"q1": 1.0}))], {"q1": 1.0})
    text = (tmp_path / "s.csv").read_text()
    assert "'=HYPERLINK(1).ipynb" in text and "'=cmd" in text


def test_a_function_answer_raises_builtins_by_name_and_nothing_else_passes_check_raises():
    import os
    import grade_stages as gs
    from course_utils.exercises import check_raises

    def answer_with(reply):
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        gs.send(from_w, reply)
        return gs.FunctionAnswer("f", to_w, from_r)

    with pytest.raises(ValueError, match="raised by your function `f`"):
        answer_with({"error": "ValueError: no", "type": "ValueError"})(1)
    check_raises(ValueError, answer_with({"error": "ValueError: no", "type": "ValueError"}), 1)
    for reply in ({"error": "Boom: x", "type": "Boom"}, {"ok": 1, "extra": 2}, {"junk": 1}):
        with pytest.raises(gs.AnswerError):
            check_raises(Exception, answer_with(reply), 1)
    assert answer_with({"ok": {"tuple": [1, {"float": "inf"}]}})(1) == (1, math.inf)
