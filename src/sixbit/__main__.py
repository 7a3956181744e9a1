"""``python -m sixbit``: the ``sixbit`` command."""

import sys

from .cli import main

sys.exit(main())
