"""``sixbit bench``: methods and peers measured side by side, and a GPU projection.

``harness`` runs and measures, ``methods`` is the registry of ours and the peers',
``counting`` counts the work a generation did, ``gpu_model`` projects it onto GPUs (labelled
PROJECTION), ``layer_shapes`` holds real-model shapes and times them, ``outputs`` writes
markdown/CSV/JSON/PNG/HTML, ``report`` writes sections of BENCHMARKS.md, ``cli`` the command.
"""
