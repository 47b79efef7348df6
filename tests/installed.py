"""The package as a user has it installed, for subprocesses that must see it
and nothing else of the repository (no ``benchmarks``, no ``tests``): a folder
with links to the packages ``pyproject.toml`` ships from this checkout, put on
``PYTHONPATH`` alone. That is what ``pip install -e .`` gives a fresh clone, and
it also holds in a git worktree, whose editable install points elsewhere.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shipped_packages() -> list[str]:
    """Top-level packages of ``[tool.setuptools.packages.find] include``."""
    text = (ROOT / "pyproject.toml").read_text()
    include = re.search(r"\[tool\.setuptools\.packages\.find\][^\[]*?include\s*=\s*\[([^\]]*)\]", text, re.S)
    names = re.findall(r"\"([A-Za-z_][\w]*)\*?\"", include.group(1))
    return [n for n in names if (ROOT / n / "__init__.py").exists()]


def site(folder: Path) -> Path:
    """``folder``/site holding a link to each shipped package of this checkout."""
    out = folder / "site"
    out.mkdir(parents=True, exist_ok=True)
    for name in shipped_packages():
        link = out / name
        if not link.exists():
            link.symlink_to(ROOT / name, target_is_directory=True)
    return out


def env(folder: Path, **extra: str) -> dict:
    """``os.environ`` with ``PYTHONPATH`` = only the installed packages."""
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    e["PYTHONPATH"] = str(site(folder))
    e.update(extra)
    return e
