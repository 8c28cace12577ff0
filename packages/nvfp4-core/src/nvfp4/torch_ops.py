"""Deprecated alias of :mod:`nvfp4_torch.ops` (the nvfp4-torch distribution); removed in the
next release. nvfp4-core itself never imports torch."""

from ._moved import moved

__getattr__ = moved(__name__, "nvfp4_torch.ops", "nvfp4-torch")
