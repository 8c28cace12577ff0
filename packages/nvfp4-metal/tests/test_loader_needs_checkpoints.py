"""Without nvfp4-checkpoints, the loader says which extra to install (the backend itself
needs no checkpoint code)."""

from __future__ import annotations

import subprocess
import sys

# nvfp4_checkpoints made unimportable (a None entry in sys.modules), as on an install of
# nvfp4-metal without its `checkpoints` extra.
_WITHOUT_CHECKPOINTS = """
import sys
sys.modules["nvfp4_checkpoints"] = None
import nvfp4_metal
assert nvfp4_metal.backend is not None
try:
    import nvfp4_metal.loader
except ImportError as e:
    print(e)
else:
    raise SystemExit("nvfp4_metal.loader imported without nvfp4_checkpoints")
"""


def test_loader_without_nvfp4_checkpoints_names_the_extra() -> None:
    r = subprocess.run(
        [sys.executable, "-c", _WITHOUT_CHECKPOINTS], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    assert "pip install 'nvfp4-metal[checkpoints]'" in r.stdout, r.stdout
    assert len(r.stdout.strip().splitlines()) == 1, r.stdout
