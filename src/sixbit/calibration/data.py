"""Calibration statistics per layer × step × branch and per block × step × branch.

Statistics are running aggregates (maxima, sums, counts), never raw activations, so memory
is bounded by (layers × steps × branches × input width). Saved as safetensors with a JSON
header; loading needs no pickle.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import torch

from ..files.safetensors import read_safetensors, save_safetensors_atomic

TAIL_QUANTILES = (0.999, 0.9999)
_VERSION = 1

Key = tuple[int, str]  # (step, branch)


@dataclasses.dataclass
class LayerStats:
    """Input statistics of one linear layer at one (step, branch), over every recorded call.

    ``channel_amax`` and ``amax`` are maxima over calls; ``mean_abs``/``std`` pool every
    element; the tail quantiles of ``|x|`` are averaged over calls.
    """

    channel_amax: torch.Tensor  # (in_features,) max |x| per input channel
    amax: float = 0.0
    count: int = 0  # elements
    sum_abs: float = 0.0
    sum_sq: float = 0.0
    calls: int = 0
    tail_sum: tuple[float, ...] = (0.0,) * len(TAIL_QUANTILES)

    @property
    def mean_abs(self) -> float:
        return self.sum_abs / max(self.count, 1)

    @property
    def std(self) -> float:
        """Root mean square of the inputs (their spread around zero, as kσ clipping uses it)."""
        return math.sqrt(self.sum_sq / max(self.count, 1))

    def tail(self, q: float) -> float:
        """Mean over calls of the ``q`` quantile of ``|x|`` (``q`` in :data:`TAIL_QUANTILES`)."""
        return self.tail_sum[TAIL_QUANTILES.index(q)] / max(self.calls, 1)

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().float().reshape(-1, x.shape[-1])
        a = x.abs()
        self.channel_amax = torch.maximum(self.channel_amax, a.amax(dim=0).cpu())
        self.amax = max(self.amax, float(a.max()))
        self.count += a.numel()
        self.sum_abs += float(a.sum(dtype=torch.float64))
        self.sum_sq += float(x.pow(2).sum(dtype=torch.float64))
        flat = a.reshape(-1)
        if flat.numel() > 1 << 24:  # torch.quantile's limit: a regular subsample
            flat = flat[:: -(-flat.numel() // (1 << 24))]
        qs = torch.quantile(flat, torch.tensor(TAIL_QUANTILES, device=flat.device))
        self.tail_sum = tuple(s + float(q) for s, q in zip(self.tail_sum, qs))
        self.calls += 1

    _SCALARS = ("amax", "count", "sum_abs", "sum_sq", "calls")


@dataclasses.dataclass
class BlockStats:
    """How much one block changes its input at one (step, branch), averaged over calls.

    ``gamma`` is the relative L1 change from input to output, ``‖out − in‖₁ / ‖in‖₁``
    (DMPQ's Γ); ``delta_change`` the relative L1 change of the residual ``Δ = out − in``
    from the previous step, ``‖Δ_t − Δ_{t−1}‖₁ / ‖Δ_{t−1}‖₁`` (what the delta cache bets on;
    NaN at a branch's first step); ``delta_mean_abs`` the mean ``|Δ|``.
    """

    gamma_sum: float = 0.0
    delta_change_sum: float = 0.0
    delta_change_calls: int = 0
    delta_abs_sum: float = 0.0
    calls: int = 0

    @property
    def gamma(self) -> float:
        return self.gamma_sum / max(self.calls, 1)

    @property
    def delta_change(self) -> float:
        return self.delta_change_sum / self.delta_change_calls if self.delta_change_calls else math.nan

    @property
    def delta_mean_abs(self) -> float:
        return self.delta_abs_sum / max(self.calls, 1)

    _SCALARS = ("gamma_sum", "delta_change_sum", "delta_change_calls", "delta_abs_sum", "calls")


@dataclasses.dataclass
class CalibrationData:
    """Everything :func:`sixbit.calibrate` recorded.

    Attributes:
        layers: layer name → (step, branch) → :class:`LayerStats`.
        blocks: block name → (step, branch) → :class:`BlockStats`.
        timesteps: step → timestep value (from the first generation).
        generations: how many generations were recorded.
    """

    layers: dict[str, dict[Key, LayerStats]] = dataclasses.field(default_factory=dict)
    blocks: dict[str, dict[Key, BlockStats]] = dataclasses.field(default_factory=dict)
    timesteps: dict[int, float] = dataclasses.field(default_factory=dict)
    generations: int = 0

    @property
    def steps(self) -> list[int]:
        return sorted(self.timesteps)

    @property
    def branches(self) -> list[str]:
        found = {b for per in (*self.layers.values(), *self.blocks.values()) for _, b in per}
        return sorted(found)

    def save(self, path: str | os.PathLike):
        """Write to a ``.safetensors`` file (atomically)."""
        tensors, keys = {}, {"layers": {}, "blocks": {}}
        for kind, table in (("layers", self.layers), ("blocks", self.blocks)):
            for name, per in table.items():
                order = sorted(per)
                keys[kind][name] = [list(k) for k in order]
                cls = LayerStats if kind == "layers" else BlockStats
                tensors[f"{kind}/{name}/scalars"] = torch.tensor(
                    [[float(getattr(per[k], f)) for f in cls._SCALARS] for k in order], dtype=torch.float64
                )
                if kind == "layers":
                    tensors[f"layers/{name}/channel_amax"] = torch.stack([per[k].channel_amax for k in order])
                    tensors[f"layers/{name}/tail_sum"] = torch.tensor([per[k].tail_sum for k in order], dtype=torch.float64)
        header = {
            "format": "sixbit-calibration",
            "version": _VERSION,
            "keys": keys,
            "tail_quantiles": list(TAIL_QUANTILES),
            "timesteps": {str(k): v for k, v in self.timesteps.items()},
            "generations": self.generations,
        }
        return save_safetensors_atomic(tensors, path, {"sixbit-calibration": json.dumps(header)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CalibrationData":
        """Read a file written by :meth:`save`."""
        metadata, tensors = read_safetensors(path, "calibration file")
        try:
            header = json.loads(metadata["sixbit-calibration"])
        except (KeyError, json.JSONDecodeError):
            raise ValueError(f"{str(path)!r} is not a sixbit calibration file") from None
        if header.get("version") != _VERSION or tuple(header.get("tail_quantiles", ())) != TAIL_QUANTILES:
            raise ValueError(f"{str(path)!r}: unsupported calibration file version {header.get('version')!r}")
        data = cls(timesteps={int(k): v for k, v in header["timesteps"].items()}, generations=header["generations"])
        try:
            for kind, table in (("layers", data.layers), ("blocks", data.blocks)):
                stats_cls = LayerStats if kind == "layers" else BlockStats
                for name, order in header["keys"][kind].items():
                    scalars = tensors[f"{kind}/{name}/scalars"]
                    per = table[name] = {}
                    for i, (step, branch) in enumerate(order):
                        values = dict(zip(stats_cls._SCALARS, scalars[i].tolist()))
                        for f in ("count", "calls", "delta_change_calls"):
                            if f in values:
                                values[f] = int(values[f])
                        if kind == "layers":
                            values["channel_amax"] = tensors[f"layers/{name}/channel_amax"][i].clone()
                            values["tail_sum"] = tuple(tensors[f"layers/{name}/tail_sum"][i].tolist())
                        per[(int(step), str(branch))] = stats_cls(**values)
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(f"{str(path)!r} is an inconsistent calibration file: missing or malformed {e}") from None
        return data
