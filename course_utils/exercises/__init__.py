"""Exercises: the checks their tests call and the self-study runner of the student editions.

- ``feedback.py``: ``check_close``, ``check_equal``, ``check_shape``, ``check_raises``: a wrong
  answer reads as a sentence that never contains the expected value.
- ``practice.py``: ``Exercises(lesson).check(name)`` / ``.reveal(name)``, the public tests run
  offline on a notebook's own variables (the tests ship in ``course_utils/practice_data/``).

Per-student variants are ``course_utils.variants.exercise_variant`` (a public name the lessons
and outside checks rely on); the student editions and the practice data are built by
``tools/student.py``.
"""
from .feedback import (check_close, check_equal, check_raises, check_shape, describe_difference,
                       describe_miss, is_unanswered)
from .practice import Exercises, load_lesson

__all__ = ["check_close", "check_equal", "check_shape", "check_raises", "is_unanswered",
           "describe_miss", "describe_difference", "Exercises", "load_lesson"]
