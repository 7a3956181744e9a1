"""Benchmark-script support: write measured tables into ``BENCHMARKS.md`` section by section.

Every benchmark script owns one named section delimited by HTML comments::

    <!-- sixbit:begin NAME -->
    ...generated markdown...
    <!-- sixbit:end NAME -->

Rewriting a section leaves every other section untouched, so scripts can be rerun
independently. The file is replaced atomically.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from sixbit.bench.machine import machine_description  # noqa: F401  (the scripts' one import)

_TITLE = "# sixbit benchmarks\n\nEvery number below is written by a script; rerun the script named in a section to refresh it.\n"


def update_section(path: str | os.PathLike, name: str, body: str) -> None:
    """Replace (or append) section ``name`` of the markdown file at ``path`` with ``body``."""
    if not re.fullmatch(r"[a-z0-9_-]+", name):
        raise ValueError(f"section name {name!r} must match [a-z0-9_-]+")
    path = Path(path)
    text = path.read_text() if path.exists() else _TITLE
    begin, end = f"<!-- sixbit:begin {name} -->", f"<!-- sixbit:end {name} -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
