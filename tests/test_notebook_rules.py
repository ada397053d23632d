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


def test_an_uncommented_markdown_line_is_named(tmp_path):
    class Source:
        src = tmp_path / "99_x.py"
    Source.src.write_text("# %% [markdown]\n# # Title\n- a list item without its '# '\n\n# %%\nx = 1\n")
    found = rules.markdown_lines_are_comments(Source())
    assert len(found) == 1 and "99_x.py:3" in found[0]
    Source.src.write_text("# %% [markdown]\n# # Title\n# - fine\n\n# %%\nx = 1\n")
    assert rules.markdown_lines_are_comments(Source()) == []
