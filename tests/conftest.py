"""Session-wide test setup: the Agg backend and ci scale, the assignments built once per session,
and the long runs started in the background when the suite starts (tests/background.py)."""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import matplotlib
import pytest

import background

# jsonschema imports rfc3987_syntax only to check the "iri" string format; `make test` keeps every
# process from building its grammar (tools/kernel_site/rfc3987_syntax.py); this does it for a
# pytest started by hand, for the imports after this file
sys.modules.setdefault("rfc3987_syntax", None)
matplotlib.use("Agg")
os.environ.setdefault("COURSE_SCALE", "ci")


@pytest.fixture(autouse=True)
def _placement_check_for_lessons_only(monkeypatch):
    """``make test`` sets COURSE_CHECK_PLACEMENT=1 for the lesson kernels nbval starts; a unit test
    that calls ``runtime.setup`` in this process must not leave the check on for the rest of the
    session (tests/test_device_placement.py turns it on in its own subprocess)."""
    monkeypatch.delenv("COURSE_CHECK_PLACEMENT", raising=False)


# The assignments tools/assign.py builds, shared by tests/test_notebook_rules.py (the rules) and
# tests/test_assignments.py (grading): built once per session. notebook_rules imports otter
# (slow), so only a session that uses these fixtures imports it.

@pytest.fixture(scope="session")
def sources(tmp_path_factory) -> dict:
    """name -> the lesson notebook with solutions (the fixture is rendered from its percent source)."""
    import notebook_rules
    return notebook_rules.lesson_notebooks(tmp_path_factory.mktemp("sources"))


@pytest.fixture(scope="session")
def dist(tmp_path_factory, sources) -> dict:
    """Run otter assign once per notebook (without executing it); a failure is kept per name."""
    import notebook_rules
    return notebook_rules.build_assignments(sources, tmp_path_factory.mktemp("dist"))


def pytest_collection_modifyitems(items):
    """Alone, the tests that wait for a background run go last, in the lane's order, so that the
    runs overlap everything else (tests/background.py). Under xdist (``-n 2 --dist loadfile``)
    there is no lane: each file is one unit of work, handed to whichever worker is free, and the
    longest go first so that neither worker is left with a long file at the end."""
    def waits(item):
        module = getattr(item, "module", None)
        if not hasattr(module, "start_in_background"):
            return (0, 0)
        return (1, background.order(module.__name__))

    def longest_first(item):
        module = getattr(item, "module", None)
        name = module.__name__ if module is not None else Path(str(item.fspath)).stem
        return background.order(name), -background.WEIGHT.get(name, 0)
    items.sort(key=longest_first if background.under_xdist() else waits)


def pytest_collection_finish(session):
    """Prepare each selected module's background run, then start the lane (tests/background.py);
    under xdist each module's run happens in its own test, on its worker."""
    if background.under_xdist():
        return
    work, seen = {}, set()
    for item in session.items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ in seen:
            continue
        seen.add(module.__name__)
        start = getattr(module, "start_in_background", None)
        if start is None:
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f"{module.__name__}_"))
        session.config.add_cleanup(lambda tmp=tmp: shutil.rmtree(tmp, ignore_errors=True))
        run = start(tmp)
        if run is not None:
            work[module.__name__] = run
    background.start(session.config, work)


def pytest_terminal_summary(terminalreporter):
    if background.TIMES:
        terminalreporter.write_line("background lane: " + ", ".join(
            f"{name} {seconds:.0f} s" for name, seconds in background.TIMES.items()))
