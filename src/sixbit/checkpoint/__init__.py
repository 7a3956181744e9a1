"""sixbit's checkpoint: one ``.safetensors`` file with the packed tensors and a JSON header.

- :mod:`~sixbit.checkpoint.file` — the file format, :func:`save`, :func:`read_header`;
- :mod:`~sixbit.checkpoint.layers` — the quantized layers' header entries and their rebuilding;
- :mod:`~sixbit.checkpoint.restore` — a checked checkpoint restored into a model (used by
  :func:`load` and by diffusers' ``from_pretrained`` of a converted folder);
- :mod:`~sixbit.checkpoint.loading` — :func:`load`;
- :mod:`~sixbit.checkpoint.finishing` — what every converted or loaded model gets (``.save``,
  diffusers' methods, its layout): one list for every way in.
"""

from .file import (FORMAT_VERSION, CheckpointWriter, check_header, check_tensors, open_checkpoint, read_header, save,
                   warn_loras_not_stored)
from .finishing import attach_save, finish, register_save_method
from .loading import load

__all__ = ["FORMAT_VERSION", "CheckpointWriter", "attach_save", "check_header", "check_tensors", "finish", "load",
           "open_checkpoint", "read_header", "register_save_method", "save", "warn_loras_not_stored"]
