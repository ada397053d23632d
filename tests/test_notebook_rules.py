"""Every lesson follows the house rules (tests/notebook_rules.py): one test item per lesson, and
the fixture tests/fixtures/98_sample.py, that lists every problem the rules find in it."""
from __future__ import annotations

import pytest

import notebook_rules as rules


@pytest.mark.parametrize("name", rules.NAMES)
def test_lesson_follows_the_house_rules(name, sources, dist):
    found = rules.problems(name, notebook=sources.get(name), assignment=dist.get(name))
    if found:
        pytest.fail(f"{name} breaks {len(found)} house rule(s) (tests/notebook_rules.py):\n"
                    + "\n".join(f"  - {p}" for p in found), pytrace=False)
