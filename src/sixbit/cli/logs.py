"""What the ``sixbit`` command shows: its own lines, sixbit's warnings and other libraries' errors.

Importing diffusers imports torchao, and with torch 2.13, torchao 0.18 and diffusers 0.42 three
libraries log at import time about things no ``sixbit`` command uses. All three are Python
``logging`` records, none comes from C++:

- ``Failed to load …/torchao/_C_mxfp8….so: Could not load this library``: torchao's warning
  (logger ``torchao``) that a CUDA extension built for another torch does not load. Nothing
  configured a handler, so Python's last-resort handler prints the bare message on stderr.
- ``W1203 … torch/utils/_pytree.py:630] <enum 'KernelPreference'> is an Enum subclass …``:
  torch's deprecation warning (logger ``torch.utils._pytree``) about the way torchao registers
  its enums, printed glog-style by the handler torch puts on its ``torch`` logger at import.
- ``Unable to import `torchao` Tensor objects …``: diffusers' warning when its torchao quantizer
  is imported, through the handler it puts on its ``diffusers`` logger (level from
  ``DIFFUSERS_VERBOSITY``, read when that handler is installed).

So the command (never the library: ``import sixbit`` configures nothing) decides before those
imports: the root logger at ERROR and sixbit's loggers at WARNING; ``DIFFUSERS_VERBOSITY`` and
``TRANSFORMERS_VERBOSITY`` set to ``error`` unless already set; torch's ``torch`` logger at
ERROR once torch has configured it, unless ``TORCH_LOGS`` is set; Python warnings raised while
the command's modules (and the libraries under them) are imported ignored. Errors still show and
stderr is never redirected. ``--debug`` does none of this and logs at DEBUG.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import warnings
from collections.abc import Iterator

FORMAT = "%(levelname)s %(name)s: %(message)s"
QUIET_ENV = {"DIFFUSERS_VERBOSITY": "error", "TRANSFORMERS_VERBOSITY": "error"}


def wants_debug(argv: list[str]) -> bool:
    """Whether ``--debug`` comes before any ``--`` in ``argv``: known before the parser is built
    (building it imports diffusers)."""
    return "--debug" in itertools.takewhile(lambda arg: arg != "--", argv)


def configure(debug: bool) -> None:
    """Logging of the ``sixbit`` process; call before torch, diffusers or torchao is imported."""
    logging.basicConfig(level=logging.DEBUG if debug else logging.ERROR, format=FORMAT)
    logging.getLogger("sixbit").setLevel(logging.DEBUG if debug else logging.WARNING)
    if not debug:
        for name, value in QUIET_ENV.items():
            os.environ.setdefault(name, value)  # read when diffusers / transformers first log


@contextlib.contextmanager
def quiet_imports(debug: bool) -> Iterator[None]:
    """Import the command's modules inside this: other libraries' import-time warnings stay out."""
    if debug:
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401  (importing torch sets its loggers to WARNING: quiet them after)

        if "TORCH_LOGS" not in os.environ:
            logging.getLogger("torch").setLevel(logging.ERROR)
        yield
