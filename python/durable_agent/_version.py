"""The package version; the native extension must report exactly the same one."""

__version__ = "0.1.0"
