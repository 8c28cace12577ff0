"""The read-bandwidth probe of the CPU benchmark: ``read_probe.c`` compiled here, once per
ISA level with that level's compiler flags, and loaded with ctypes.

It lives with the benchmarks, not in nvfp4-cpu: the shipped library carries kernels only.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

SOURCE = Path(__file__).with_name("read_probe.c")

#: Compiler flags per nvfp4-cpu ISA level (the same vector widths its kernels use).
FLAGS = {
    "portable": [],
    "avx2": ["-mavx2", "-mfma"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl"],
}


@functools.cache
def _library(isa: str) -> Any:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("the read probe needs a C compiler (cc or gcc)")
    out = Path(tempfile.mkdtemp(prefix="nvfp4-read-probe-")) / f"read_probe_{isa}.so"
    cmd = [cc, "-O3", "-shared", "-fPIC", "-pthread", *FLAGS[isa], str(SOURCE), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(out))
    lib.read_probe.restype = ctypes.c_uint64
    lib.read_probe.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    return lib


def read_probe(isa: str, threads: int, buf: np.ndarray) -> int:
    """Read every whole MiB of ``buf`` with ``threads`` threads and ``isa``'s widest loads;
    returns a checksum (time the call)."""
    a = np.ascontiguousarray(buf)
    return int(_library(isa).read_probe(a.ctypes.data_as(ctypes.c_void_p), a.nbytes, threads))
