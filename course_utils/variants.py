"""Per-student exercise variants: each learner predicts and measures a configuration of their own.

A lesson's exercises that predict or compute a number take their configuration from the learner's
``STUDENT_ID`` (the lesson's ``parameters`` cell; ``$COURSE_STUDENT_ID`` when tools/grade.py grades
a submission, which sets it to the submission's file name)::

    task = exercise_variant("03_moco", STUDENT_ID, queue_size=(4096, 1024, 2048, 8192),
                            width=(16, 8, 24))
    task.queue_size        # one of the choices, the same every time for this student and lesson

The choice is drawn from SHA-256 of ``"<lesson>/<student id>"`` (the ID stripped and case-folded,
so "Alice " and "alice" are one student), one draw per option, independent of the order in which
the options are written. An empty ID (self-study) gives every option's *first* choice: the lesson's
own configuration, so the reader's numbers match the lesson text. Exercise tests compare answers
with the kit's live measurement *for ``task``*, never with a typed number, so a public solution
teaches the method while each student's numbers are their own (docs/instructor.md).

Why not ``random.Random(id)``: Python's string hashing is salted per process, and ``random``'s
algorithm is not promised across versions; a digest is the same on every machine, forever.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["exercise_variant", "ExerciseVariant", "student_id", "STUDENT_ENV"]

STUDENT_ENV = "COURSE_STUDENT_ID"


def student_id(value: str | None = None) -> str:
    """The student ID exercises are drawn for: ``value`` if given, else ``$COURSE_STUDENT_ID``,
    else "" (self-study: the lesson's own configuration)."""
    value = os.environ.get(STUDENT_ENV, "") if value is None else value
    if not isinstance(value, str):
        raise TypeError(f"STUDENT_ID must be a str (your name or student ID, in quotes), "
                        f"got {type(value).__name__} {value!r}")
    return value.strip()


def _draw(lesson: str, student: str, option: str, n: int) -> int:
    digest = hashlib.sha256(f"{lesson}/{student.casefold()}/{option}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


class ExerciseVariant:
    """One student's configuration of one lesson's exercises: read options as attributes
    (``task.queue_size``) or ``task.as_dict()``; shows itself as a sentence in a notebook."""

    def __init__(self, lesson: str, student: str, values: dict[str, Any]):
        self.lesson, self.student = lesson, student
        self._values = dict(values)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"this exercise configuration has no {name!r}; it has "
                             f"{sorted(values)}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("lesson", "student", "_values") and name not in self.__dict__:
            object.__setattr__(self, name, value)
        else:  # an answer computed for a hand-edited configuration would check against the wrong one
            raise AttributeError("an exercise configuration is read-only; change STUDENT_ID "
                                 "instead")

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__(name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExerciseVariant) and (self.lesson, self._values) == \
            (other.lesson, other._values)

    def __hash__(self) -> int:
        return hash((self.lesson, tuple(sorted(self._values.items()))))

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __repr__(self) -> str:
        def shown(v):   # as a reader reads it: 6 and 10, not the tuple (6, 10)
            if isinstance(v, (tuple, list)):
                return " and ".join(map(str, v)) if len(v) == 2 else ", ".join(map(str, v))
            return str(v)
        settings = "; ".join(f"{k} {shown(v)}" for k, v in self._values.items())
        if not self.student:
            return (f"Exercise configuration of {self.lesson}: {settings}\n(no STUDENT_ID set, so "
                    "this is the lesson's own configuration; set STUDENT_ID in the parameters "
                    "cell at the top to your name or student ID to get yours)")
        return f"Exercise configuration of {self.lesson} for student {self.student!r}: {settings}"


def exercise_variant(lesson: str, student: str | None = None,
                     **options: Sequence[Any]) -> ExerciseVariant:
    """Draw one value per option for ``student`` (see the module docstring). Each option is a
    non-empty sequence of choices whose first entry is the lesson's own value."""
    if not isinstance(lesson, str) or not lesson:
        raise TypeError(f"lesson must be the notebook's name like '03_moco', got {lesson!r}")
    student = student_id(student)
    if not options:
        raise ValueError("give at least one option, e.g. queue_size=(4096, 1024, 2048)")
    values = {}
    for name, choices in options.items():
        if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) or not choices:
            raise ValueError(f"option {name!r} must be a non-empty list or tuple of choices "
                             f"(the first is the lesson's own), got {choices!r}")
        values[name] = choices[_draw(lesson, student, name, len(choices))] if student \
            else choices[0]
    return ExerciseVariant(lesson, student, values)
