"""tools/kernel_client.py: a wait for a kernel message made of one-second polls reads a message
whose wake-up the first poll missed within a slice (one long poll would sleep to its deadline),
gives up at the same deadline as one long poll, and is what the kit's notebook runs use."""
from __future__ import annotations

import ast
import asyncio
import sys
import time
from pathlib import Path
from queue import Empty

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import kernel_client  # noqa: E402
from kernel_client import CLIENT_OPTIONS, SlicedPollChannel, wait_in_slices  # noqa: E402


class MissedWakeUp:
    """A socket poll whose message is there from the start, but whose first poll misses the
    wake-up: it sleeps its whole timeout and reports nothing (what nbclient#312 looks like)."""

    def __init__(self):
        self.polls = []

    async def __call__(self, timeout):
        self.polls.append(timeout)
        if len(self.polls) == 1:
            await asyncio.sleep(timeout)
            raise Empty
        return {"msg": "reply"}


def test_a_missed_wake_up_costs_one_slice_not_the_deadline():
    poll = MissedWakeUp()
    start = time.monotonic()
    got = asyncio.run(wait_in_slices(poll, timeout=30.0, slice_seconds=0.05))
    assert got == {"msg": "reply"}
    assert time.monotonic() - start < 5, "the second poll, a slice later, reads the message"
    assert poll.polls[0] == pytest.approx(0.05)
    poll = MissedWakeUp()
    start = time.monotonic()
    assert asyncio.run(wait_in_slices(poll, timeout=None, slice_seconds=0.05)) == {"msg": "reply"}
    assert time.monotonic() - start < 5, "no time limit (grading) is no longer 'forever'"


def test_no_message_gives_up_at_the_deadline():
    polls = []

    async def nothing(timeout):
        polls.append(timeout)
        await asyncio.sleep(timeout)
        raise Empty
    start = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(wait_in_slices(nothing, timeout=0.3, slice_seconds=0.05))
    assert 0.3 <= time.monotonic() - start < 3
    polls.clear()
    with pytest.raises(Empty):  # timeout 0: one poll that does not wait, as before
        asyncio.run(wait_in_slices(nothing, timeout=0, slice_seconds=0.05))
    assert polls == [0]


def test_the_channel_polls_in_slices(monkeypatch):
    """SlicedPollChannel.get_msg hands jupyter_client's get_msg one slice at a time (a channel
    that passed the caller's timeout on would be one long poll again)."""
    from jupyter_client.channels import AsyncZMQSocketChannel
    poll, asked = MissedWakeUp(), []

    def one_poll(self, timeout=None):   # records what it was asked for, sleeps only briefly
        asked.append(timeout)
        return poll(0.01)
    monkeypatch.setattr(AsyncZMQSocketChannel, "get_msg", one_poll)
    channel = object.__new__(SlicedPollChannel)
    assert asyncio.run(channel.get_msg(timeout=None)) == {"msg": "reply"}
    assert asyncio.run(channel.get_msg(timeout=600)) == {"msg": "reply"}
    assert asked == [kernel_client.POLL_SECONDS] * 3   # the missed poll, its retry, the next wait


def test_notebooks_run_on_the_sliced_channels(tmp_path):
    """A real kernel through nbclient with the kit's options: its shell and iopub channels are
    the sliced ones, and a widget cell (what lesson 01 shows) and the cell after it run."""
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import ipywidgets\nipywidgets.IntSlider(3)"),
        nbformat.v4.new_code_cell("print(6 * 7)")])
    client = NotebookClient(nb, timeout=60, kernel_name="python3", **CLIENT_OPTIONS,
                            resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        assert isinstance(client.kc.shell_channel, SlicedPollChannel)
        assert isinstance(client.kc.iopub_channel, SlicedPollChannel)
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    assert nb.cells[1].outputs[0]["text"] == "42\n"


def test_interact_cells_do_not_stall(tmp_path):
    """ipywidgets.interact cells, the kind that stalled: with nbclient's own kernel client, on
    this machine with both cores busy, 5 of the first 42 such cells waited exactly their 20 s
    limit before their reply was read (2026-12-07); through the kit's options, 180 of them and
    the cells between ran with none over 2 s. Here 30, each well within its limit (with nbclient's
    own client and both cores busy, this test failed: a cell waited its whole limit)."""
    from nbclient import NotebookClient
    cell = nbformat.v4.new_code_cell("ipywidgets.interact(lambda x: x, x=4)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import ipywidgets"), cell])
    client = NotebookClient(nb, timeout=60, kernel_name="python3", **CLIENT_OPTIONS,
                            resources={"metadata": {"path": str(tmp_path)}})
    slowest = 0.0
    with client.setup_kernel():
        client.execute_cell(nb.cells[0], 0)
        for _ in range(30):
            start = time.monotonic()
            client.execute_cell(cell, 1)
            slowest = max(slowest, time.monotonic() - start)
    assert slowest < 10, f"an interact cell took {slowest:.1f} s: a missed wake-up?"


def _passes_client_options(path: Path) -> list[str]:
    """The calls in ``path`` (NotebookClient(...), execute_notebook(...)) given **CLIENT_OPTIONS."""
    calls = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]
    return [ast.unparse(c.func) for c in calls
            if any(k.arg is None and ast.unparse(k.value) == "CLIENT_OPTIONS" for k in c.keywords)]


@pytest.mark.parametrize("path, call", [
    ("tools/grade_stages.py", "NotebookClient"), ("tools/run_course.py", "pm.execute_notebook"),
    ("tools/gpu_check.py", "pm.execute_notebook"), ("tests/kernel_run.py", "NotebookClient")])
def test_the_kits_notebook_runs_use_it(path, call):
    """Every place the kit executes a notebook (grading a submission, make course, gpu_check, the
    student-edition tests) passes the options to the call that runs it (tests/test_wheel.py's
    runs do too, in a script of their own)."""
    assert _passes_client_options(ROOT / path) == [call]
