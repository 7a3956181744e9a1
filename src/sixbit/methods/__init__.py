"""Runtime methods, one package each: config → state → hook → ``apply_x`` / ``remove_x``, with
their fit and checkpoint extension beside them.

- :mod:`~sixbit.methods.dmpq` — activation precision (NVFP4 or INT8) per block and step;
- :mod:`~sixbit.methods.delta_cache` — skip blocks whose residual is stable (TDC + PDR);
- :mod:`~sixbit.methods.static_w8a8` — static, timestep-aware W8A8 scales;
- :mod:`~sixbit.methods.stabilize` — quantize each token's temporal mean and deviation apart.
"""
