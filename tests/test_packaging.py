"""The kit installs the same way everywhere: pyproject and environment.yml agree, ranges only."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req.strip(), maxsplit=1)[0].lower()


def pyproject_requirements() -> dict:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["dev"]
    return {_name(r): r.replace(" ", "") for r in reqs}


def conda_requirements() -> dict:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    return {_name(r): r.replace(" ", "") for r in pip if not r.startswith("-e")}


def test_environment_yml_matches_pyproject():
    assert conda_requirements() == pyproject_requirements()


def test_requirements_are_ranges_not_pins():
    for req in pyproject_requirements().values():
        assert "==" not in req, f"{req}: use a range so Colab's preinstalled torch is kept"
    assert pyproject_requirements()["torch"] == "torch>=2.7"  # FSDP2 fully_shard on CPU


def test_readme_commands_and_ci():
    readme = (ROOT / "README.md").read_text()
    assert "make course" in readme and "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "set -euo pipefail" in ci
