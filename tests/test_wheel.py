"""The kit installed the way Colab installs it: a wheel built from pyproject.toml, installed
non-editable into an environment outside the repository, its package folder read-only; lessons 00
and 01 (their student editions, what the Colab badge opens) run at CI scale from a folder that is
not the repository, every check "not attempted" while blank and passing with the solutions.

No network: the wheel is built with --no-deps --no-build-isolation, and the new environment sees
the current one's site-packages (torch and the rest) through a .pth file, after its own, so
``course_utils`` comes from the wheel; the test asserts it.
"""
from __future__ import annotations

import os
import shutil
import site
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

import background
from test_student_editions import assert_blank_run, blank_then_solve, solved

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ["00_tour", "01_resource_ledger"]
RUN_LESSONS = '''
import sys, nbformat
from nbclient import NotebookClient
sys.path.insert(0, sys.argv.pop(1))   # the repository's tools/ (kernel_client), not course_utils
from kernel_client import CLIENT_OPTIONS
for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       **CLIENT_OPTIONS,
                       resources={"metadata": {"path": "."}}).execute()
    finally:
        nbformat.write(nb, path)
'''


def _outside_env() -> dict[str, str]:
    """This environment without what points into the repository: with PYTHONPATH at a checkout
    that holds course_utils.egg-info (an editable install's metadata), pip would count the kit
    as already installed and skip the wheel."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COURSE_DATA_DIR")}


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("env", _outside_env())
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd[:4]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def runtime_data_files() -> list[str]:
    """Every file in course_utils/ that is not Python: what the kit reads at run time."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "course_utils").rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts)


def build_wheel(tmp: Path) -> Path:
    """A wheel built from a copy of the package sources (the build leaves nothing in the repo)."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "course_utils", src / "course_utils",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "-q", "-w", str(tmp / "dist"), str(src)], timeout=300)
    (built,) = (tmp / "dist").glob("course_utils-*.whl")
    return built


def install_and_run(wheel: Path, tmp: Path) -> dict:
    """Install ``wheel`` into a new environment, make its package read-only and run the lessons'
    student editions there, blank then solved; returns where everything is."""
    venv, work = tmp / "venv", tmp / "work"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    py = venv / "bin" / "python"
    inner = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
                 .stdout.strip())
    # the current environment's packages, after the new one's own (no course_utils there: not
    # a site dir, so its editable-install hooks are not run)
    (inner / "zz_outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], timeout=300)
    package = inner / "course_utils"
    for p in [package, *package.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    work.mkdir()
    for name in LESSONS:
        nbformat.write(blank_then_solve(ROOT / "notebooks" / "student" / f"{name}.ipynb"),
                       work / f"{name}.ipynb")
    env = _outside_env()
    env.update(COURSE_SCALE="ci", MPLBACKEND="Agg")
    try:
        _run([str(py), "-c", RUN_LESSONS, str(ROOT / "tools"), *[f"{n}.ipynb" for n in LESSONS]], cwd=work, env=env,
             timeout=900)
    finally:
        for p in [package, *package.rglob("*")]:  # let the folder be cleaned up
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dict(package=package, work=work)


def start_in_background(tmp: Path):
    """Build, install and run in the background (tests/background.py): it is all subprocesses
    (pip, a new environment, two kernels)."""
    def build_install_run() -> dict:
        (tmp / "build").mkdir()
        (tmp / "install").mkdir()
        wheel = build_wheel(tmp / "build")
        return dict(wheel=wheel, run=install_and_run(wheel, tmp / "install"))
    return build_install_run


@pytest.fixture(scope="module")
def installed(request) -> dict:
    return background.result(request, start_in_background, "wheel")


def test_wheel_holds_the_runtime_data_files(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    data = runtime_data_files()
    assert any(d.startswith("course_utils/practice_data/") for d in data)
    missing = [d for d in data if d not in names]
    assert not missing, f"not in the wheel (add them to [tool.setuptools.package-data]): {missing}"


def test_installed_wheel_runs_lessons_00_and_01_outside_the_repository(installed):
    package, work = installed["run"]["package"], installed["run"]["work"]
    for name in LESSONS:
        nb = nbformat.read(work / f"{name}.ipynb", as_version=4)
        assert_blank_run(nb, name)
        result = solved(nb)
        assert Path(result["kit"]).is_relative_to(package), \
            f"{name} imported course_utils from {result['kit']}, not from the installed wheel"
        assert set(result["status"].values()) == {"passed"}, result["status"]
    assert (work / "data").is_dir(), "dataset caches belong in ./data of the working folder"
