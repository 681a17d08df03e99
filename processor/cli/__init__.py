"""The ``ductor`` command line (see main.py)."""

from processor.cli.main import main

__all__ = ["main"]
