"""The version of nvfp4-rocm (read by the build, imported by the package)."""

__version__ = "0.1.0"
