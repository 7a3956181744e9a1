"""Files sixbit writes and reads: safetensors written atomically and read with clear errors
(:mod:`~sixbit.files.safetensors`), and temporary files a SIGTERM removes
(:mod:`~sixbit.files.tempfiles`). The lowest package: it imports nothing else of sixbit."""
