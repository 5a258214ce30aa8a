"""No merge-conflict marker is left in a tracked text file (one was, in a docstring, where no
other test could see it: ``reconcile/sweep/__init__.py`` after the atk3 merge)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)
TEXT = (".py", ".md", ".toml", ".ini", ".cfg", ".txt", ".yml", ".yaml", ".sh", "Makefile", "run")


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return [ROOT / name for name in out.splitlines() if name.endswith(TEXT)]


def test_no_tracked_file_holds_a_merge_conflict_marker() -> None:
    files = _tracked()
    assert len(files) > 100  # the listing worked
    found = [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
             for path in files if path.is_file()
             for text in [path.read_text(errors="replace")]
             for m in MARKER.finditer(text)]
    assert found == []
