"""The ``sixbit`` command line.

One package: :mod:`.app` (the parser, ``demo``, ``formats`` and error reporting),
:mod:`.commands` (convert, generate, eval, info), :mod:`.tune`, :mod:`.bench`, :mod:`.args` (the
argument types and checks they share) and :mod:`.logs` (what the command shows). This module
stays light: :func:`main` configures logging before anything imports diffusers or torchao, whose
import-time warnings would otherwise come before the command's own output.
Errors are one line on stderr (``--debug`` shows the traceback) with exit code 2 for bad input,
1 for anything unexpected; ``sixbit tune`` exits with 3 when its ``--min-psnr`` is not reached
(it writes the best config found all the same).
"""

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
