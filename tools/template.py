"""Text every lesson notebook starts with; tests/test_notebooks_meta.py checks it."""

REPO = "training-ledger/course-kit"
BADGE = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
         "(https://colab.research.google.com/github/{repo}/blob/main/notebooks/{name}.ipynb)")

INSTALL_CELL = '''# On Colab, install the kit with one pip command (Colab's own torch is kept); elsewhere this does nothing.
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "git+https://github.com/training-ledger/course-kit.git"], check=True)'''


def badge(name: str) -> str:
    return BADGE.format(repo=REPO, name=name)
