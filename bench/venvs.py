"""The venvs the benchmarks install peers into (``~/.cache/kvgate/...``), made on first use from
the package registry. A venv counts as ready once every install of it succeeded: a stamp in it
records what was installed, so an interrupted install, or a changed pin, installs again."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

STAMP = ".kvgate-installed"


def venv_bin(venv: Path, *installs: Sequence[str]) -> tuple[Path | None, str]:
    """``venv``'s ``bin`` folder with each of ``installs`` (``pip install`` arguments, in
    order) done, or None and why."""
    wanted = "\n".join(" ".join(args) for args in installs)
    stamp = venv / STAMP
    bin_dir = venv / "bin"
    if stamp.exists() and stamp.read_text() == wanted:
        return bin_dir, ""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        for args in installs:
            pip = [str(bin_dir / "pip"), "install", "--quiet", *args]
            subprocess.run(pip, check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        return None, f"could not install {wanted.replace(chr(10), '; ')}: {exc}"
    stamp.write_text(wanted)
    return bin_dir, ""
