"""DESIGN.md's layer order, pinned: policy < store < runtime < pipelines < service, with sim
beside them (it imports none of them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_layers_only_import_downwards() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DESIGN.md layers KEPT" in done.stdout
    assert "sim beside the layers KEPT" in done.stdout
    assert "Contracts: 2 kept, 0 broken." in done.stdout
