"""The version of nvfp4-torch (read by the build, imported by the package)."""

__version__ = "0.1.0"
