"""Per-student exercise variants (course_utils/variants.py): stable, spread out, lesson's own
configuration without an ID, and clear errors."""
import pytest

from course_utils.variants import ExerciseVariant, exercise_variant, student_id

OPTIONS = dict(queue_size=(4096, 1024, 2048, 8192, 16384), width=(16, 8, 24, 32))


def test_no_student_gets_the_lessons_own_configuration(monkeypatch):
    monkeypatch.delenv("COURSE_STUDENT_ID", raising=False)
    task = exercise_variant("03_moco", "", **OPTIONS)
    assert task.as_dict() == {"queue_size": 4096, "width": 16}
    assert "no STUDENT_ID set" in repr(task)


def test_a_student_always_gets_the_same_draw_and_ids_are_normalised():
    a = exercise_variant("03_moco", "Ada Lovelace", **OPTIONS)
    assert a == exercise_variant("03_moco", "  ada lovelace ", **OPTIONS)
    # the option order in the call does not change the draw
    b = exercise_variant("03_moco", "Ada Lovelace", width=OPTIONS["width"],
                         queue_size=OPTIONS["queue_size"])
    assert a.as_dict() == b.as_dict()
    assert "for student 'Ada Lovelace'" in repr(a)


def test_the_draw_spreads_over_the_choices_and_depends_on_the_lesson():
    students = [f"student{i:03d}" for i in range(400)]
    counts = {}
    for s in students:
        q = exercise_variant("03_moco", s, **OPTIONS).queue_size
        counts[q] = counts.get(q, 0) + 1
    # 400 draws over 5 choices: each about 80; a draw that ignored the ID would put all 400 in one
    assert set(counts) == set(OPTIONS["queue_size"]) and min(counts.values()) > 40, counts
    same = sum(exercise_variant("03_moco", s, **OPTIONS) .as_dict() ==
               exercise_variant("04_mae", s, **OPTIONS).as_dict() for s in students)
    assert same < 60, "two lessons should draw independently (about 1 in 20 coincide)"


def test_the_environment_gives_the_graders_id(monkeypatch):
    monkeypatch.setenv("COURSE_STUDENT_ID", "grace")
    assert student_id() == "grace"
    assert exercise_variant("03_moco", None, **OPTIONS) == exercise_variant("03_moco", "grace", **OPTIONS)


def test_a_configuration_is_read_only_and_bad_input_is_explained():
    task = exercise_variant("03_moco", "ada", **OPTIONS)
    assert isinstance(task, ExerciseVariant) and task["width"] == task.width
    with pytest.raises(AttributeError, match="read-only"):
        task.width = 3
    with pytest.raises(AttributeError, match="has no 'depth'"):
        task.depth
    with pytest.raises(TypeError, match="must be a str"):
        exercise_variant("03_moco", 1234, **OPTIONS)
    with pytest.raises(ValueError, match="non-empty list or tuple"):
        exercise_variant("03_moco", "ada", width=())
    with pytest.raises(ValueError, match="non-empty list or tuple"):
        exercise_variant("03_moco", "ada", width="16")
    with pytest.raises(ValueError, match="at least one option"):
        exercise_variant("03_moco", "ada")
