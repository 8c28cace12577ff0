"""Deprecated alias of :mod:`nvfp4_torch.loader` (``pip install 'nvfp4-torch[models]'``);
removed in the next release."""

from nvfp4._moved import moved

__getattr__ = moved(__name__, "nvfp4_torch.loader", "nvfp4-torch[models]")
