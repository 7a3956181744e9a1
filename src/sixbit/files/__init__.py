"""Files sixbit writes and reads: any file written atomically (:mod:`~sixbit.files.atomic`),
safetensors written so and read with clear errors (:mod:`~sixbit.files.safetensors`), and
temporary files a SIGTERM removes (:mod:`~sixbit.files.tempfiles`). The lowest package: it imports nothing else of sixbit."""
