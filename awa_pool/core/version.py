"""The package version, kept apart so setup.cfg can read it without imports."""

__version__ = "0.1.0"
