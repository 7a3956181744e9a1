"""The command's entry point, light: :func:`main` configures logging before anything imports diffusers."""

from __future__ import annotations

import argparse
import sys

from . import logs


def main(argv: list[str] | None = None) -> int:
    """Run the ``sixbit`` command with ``argv`` (default ``sys.argv[1:]``) and return its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = logs.wants_debug(argv)
    logs.configure(debug)
    with logs.quiet_imports(debug):
        from .app import run
    return run(argv)


def build_parser() -> argparse.ArgumentParser:
    """The ``sixbit`` argument parser (building it imports diffusers)."""
    from .app import build_parser as build

    return build()


__all__ = ["build_parser", "main"]
