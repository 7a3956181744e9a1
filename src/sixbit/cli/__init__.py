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

from .entry import build_parser, main

__all__ = ["build_parser", "main"]
