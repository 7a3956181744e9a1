"""``python -m sixbit.cli``: the ``sixbit`` command."""

import sys

from . import main

sys.exit(main())
