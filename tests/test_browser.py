"""The widgets, in a real browser: JupyterLab on localhost (a free port, a random token), headless
Chromium driven by playwright. Lesson 01's student edition runs to the end, then the ledger
explorer's batch slider moves one step and the predicted ledger it prints must follow (kept for
backward in proportion to the batch, parameters unchanged); the same for lesson 06's "what fits"
widget (activations in proportion to the batch, parameters unchanged).

Needs a Chromium binary (Debian: `apt-get install -y chromium`; .ci/run installs it) and the
Python `playwright` package (a dev dependency); without them the test skips and says why.
JupyterLab serves temporary copies of the notebooks with its home, config, data, runtime,
settings and workspace folders in a temporary directory, so nothing is written into the
repository; the server and its kernels are killed at the end, whatever the outcome.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STUDENT = "notebooks/student"
RUN_ALL_TIMEOUT_S = 180  # each lesson takes ~20 s at CI scale on an idle core


def chromium() -> str:
    """Path of the Chromium to drive (COURSE_CHROMIUM overrides the lookup); skips without one."""
    path = os.environ.get("COURSE_CHROMIUM") or shutil.which("chromium") or \
        shutil.which("chromium-browser")
    if not path:
        pytest.skip("chromium not found: apt-get install chromium, or see README")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright not installed: pip install -e '.[dev]', or see README")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_environment(tmp: Path) -> dict[str, str]:
    """The server's environment: every folder Jupyter, IPython or matplotlib writes to points into
    ``tmp``; CI scale; the repository's course_utils importable without writing bytecode there."""
    dirs = {name: tmp / name.lower() for name in (
        "HOME", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR",
        "MPLCONFIGDIR", "JUPYTERLAB_WORKSPACES_DIR", "JUPYTERLAB_SETTINGS_DIR")}
    for d in dirs.values():
        d.mkdir()
    # every cell in the DOM (JupyterLab 4 otherwise renders only the cells in view)
    tracker = dirs["JUPYTERLAB_SETTINGS_DIR"] / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    return {**os.environ, **{k: str(v) for k, v in dirs.items()},
            "COURSE_SCALE": "ci", "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (read from /proc; empty where there is none)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state_and_parent = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(state_and_parent[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def stop(proc: subprocess.Popen) -> None:
    """Stop the server and its kernels. jupyter_client starts each kernel in a session of its own,
    so the kernels are collected first and killed by id if the server's shutdown left any."""
    kernels = children(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
        proc.wait(15)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    for pid in kernels:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(base url, token, chromium path, HOME for the browser) of a JupyterLab serving copies of
    the student editions; stopped afterwards."""
    browser = chromium()
    tmp = tmp_path_factory.mktemp("lab")
    served = tmp / "served"
    shutil.copytree(ROOT / STUDENT, served / STUDENT)  # JupyterLab saves what it runs
    env = lab_environment(tmp)
    port, token = free_port(), secrets.token_hex(16)
    log_path = tmp / "lab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={served}",
             "--LabApp.expose_app_in_browser=True", "--ServerApp.port_retries=0", "--allow-root"],
            cwd=served, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.3)
        yield base, token, browser, env["HOME"]
    finally:
        stop(proc)


# JavaScript run in the page. PANEL finds the notebook's panel by path, whichever tab is active.
PANEL = """(path) => { for (const w of window.jupyterapp.shell.widgets('main'))
                         if (w.context && w.context.path === path) return w;
                       return null; }"""
KERNEL_READY = f"""(path) => {{ const p = ({PANEL})(path);
    const k = p && p.context.isReady && p.sessionContext.isReady && p.sessionContext.session
              && p.sessionContext.session.kernel;
    return !!k && k.connectionStatus === 'connected' && k.status === 'idle'; }}"""
# Run All is finished when the kernel is idle, no prompt shows [*] (running or queued), and every
# non-empty code cell has an execution count; it stopped early when a cell shows an error.
RUN_STATE = f"""(path) => {{ const p = ({PANEL})(path), out = {{pending: [], errors: []}};
    out.kernel = p.sessionContext.session.kernel.status;
    p.content.widgets.forEach((cell, i) => {{
        if (cell.model.type !== 'code') return;
        const prompt = cell.node.querySelector('.jp-InputPrompt');
        const busy = prompt && prompt.textContent.includes('*');
        if (busy || (cell.model.sharedModel.getSource().trim() && !cell.model.executionCount))
            out.pending.push(i);
        for (let j = 0; j < cell.model.outputs.length; j++) {{
            const o = cell.model.outputs.get(j).toJSON();
            if (o.output_type === 'error') out.errors.push(i + ': ' + o.ename + ': ' + o.evalue);
        }}
    }});
    return out; }}"""


def start_run_all(page, path: str) -> None:
    """Once ``path``'s kernel is connected and idle, start Run All without waiting for it (the
    command's promise resolves only when the last cell has run)."""
    page.wait_for_function(KERNEL_READY, arg=path, timeout=60_000)
    page.evaluate(f"""(path) => {{ const p = ({PANEL})(path);
                          window.jupyterapp.shell.activateById(p.id);
                          window.jupyterapp.commands.execute('notebook:run-all-cells'); }}""",
                  path)


def wait_run_all(page, path: str, timeout_s: float) -> None:
    """Return once every cell of ``path`` has run; fail with the errors cells show (Run All stops
    at the first), or with the cells still pending after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = page.evaluate(RUN_STATE, path)
        assert not state["errors"], f"{path}: {state['errors']}"
        if state["kernel"] == "idle" and not state["pending"]:
            return
        assert time.monotonic() < deadline, \
            f"{path}: Run All not finished after {timeout_s:.0f} s: {json.dumps(state)}"
        page.wait_for_timeout(300)


def widget_text(widget) -> str:
    return "\n".join(widget.locator(".jp-OutputArea-output").all_inner_texts())


def read_numbers(text: str, patterns: dict[str, str]) -> dict[str, float] | None:
    """{name: the number ``patterns[name]``'s group captures in text}, None if one is missing."""
    found = {name: re.search(p, text) for name, p in patterns.items()}
    return None if None in found.values() else {n: float(m.group(1)) for n, m in found.items()}


def batch_step(page, control: str, patterns: dict[str, str]) -> tuple[float, dict, dict]:
    """In the interact widget that has a control labelled ``control``, press → on its ``batch``
    slider; (new batch / old batch, numbers read before, numbers read after), each read from the
    widget's output with ``patterns`` once all of them are there and the text has changed."""
    widget = page.locator(".widget-interact", has=page.locator(f"label:text-is('{control}')")).first
    widget.scroll_into_view_if_needed()
    slider = widget.locator(".widget-slider", has=page.locator("label:text-is('batch')")).first
    readout = slider.locator(".widget-readout")

    def numbers_once(unlike: str | None) -> tuple[str, dict]:
        deadline = time.monotonic() + 30
        while True:
            text = widget_text(widget)
            numbers = read_numbers(text, patterns)
            if numbers and text != unlike:
                return text, numbers
            assert time.monotonic() < deadline, \
                f"the '{control}' widget never showed {list(patterns)} (new ones):\n{text[:2000]}"
            page.wait_for_timeout(200)

    text, before = numbers_once(None)
    batch_before = int(readout.inner_text())
    slider.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")
    _, after = numbers_once(text)
    batch_after = int(readout.inner_text())
    assert batch_after > batch_before, (batch_before, batch_after)
    return batch_after / batch_before, before, after


WIDGETS = {  # lesson: (a control only its widget has, what grows with the batch, what must not)
    "01_resource_ledger": ("width", r"kept for backward: ([\d.]+) MB", r"parameters: ([\d.]+) MB"),
    "06_training_memory": ("recompute", r"activations: ([\d.]+) GiB", r"(?m)^params: ([\d.]+) GiB"),
}


def notebook(lesson: str) -> str:
    return f"{STUDENT}/{lesson}.ipynb"


@pytest.fixture(scope="module")
def pages(lab):
    """{lesson: its page in headless Chromium}, each lesson's student edition open in a workspace
    of its own with Run All started: the lessons run side by side, a kernel each."""
    from playwright.sync_api import sync_playwright
    base, token, browser, home = lab
    with sync_playwright() as p:
        chrome = p.chromium.launch(executable_path=browser, headless=True, args=["--no-sandbox"],
                                   env={**os.environ, "HOME": home})
        try:
            pages = {lesson: chrome.new_page(viewport={"width": 1400, "height": 1000})
                     for lesson in WIDGETS}
            for lesson, page in pages.items():  # ?reset: no tabs restored from elsewhere
                page.goto(f"{base}/lab/workspaces/{lesson}/tree/{notebook(lesson)}"
                          f"?reset&token={token}")
            for lesson, page in pages.items():
                start_run_all(page, notebook(lesson))
            yield pages
        finally:
            chrome.close()


@pytest.mark.parametrize("lesson", list(WIDGETS))
def test_widget_follows_its_batch_slider_in_jupyterlab(pages, lesson):
    control, grows, fixed = WIDGETS[lesson]
    wait_run_all(pages[lesson], notebook(lesson), RUN_ALL_TIMEOUT_S)
    ratio, before, after = batch_step(pages[lesson], control, {"grows": grows, "fixed": fixed})
    assert after["fixed"] == before["fixed"], (before, after)
    assert after["grows"] / before["grows"] == pytest.approx(ratio, rel=0.01), \
        (ratio, before, after)
