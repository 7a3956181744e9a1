"""Load a pipeline from what a user types: a shipped model, a local folder or a hub id.

``shapes-cogvideox`` and ``shapes-wan`` are the models inside the package; a folder written by
``save_pretrained`` loads without network; anything else is taken as a Hugging Face Hub id and
fails with a clear message when the hub cannot be reached.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from diffusers import DiffusionPipeline

from .zoo import shapes

logger = logging.getLogger(__name__)

SHIPPED = {"shapes-cogvideox": "cogvideox", "shapes-wan": "wan"}
SHAPES_CLASSES = {"ShapesCogVideoXPipeline": "cogvideox", "ShapesWanPipeline": "wan"}


def shapes_arch(pipe) -> str | None:
    """``"cogvideox"``/``"wan"`` for a shapes pipeline (the judge applies), else ``None``."""
    return SHAPES_CLASSES.get(type(pipe).__name__)


def is_transformer_folder(model: str) -> bool:
    """Whether ``model`` is a bare diffusers model folder (``config.json``, no ``model_index.json``),
    such as a pipeline's ``transformer/``: it converts (calibration-free presets stream from it)
    but cannot generate, which needs the whole pipeline."""
    path = Path(model)
    return (path / "config.json").is_file() and not (path / "model_index.json").is_file()


def local_folder(model: str) -> Path:
    """The folder ``model`` (a shipped name or a local pipeline folder) is read from; a hub id is
    refused: what streams from the files needs them on disk."""
    if model in SHIPPED:
        return shapes.WEIGHTS_DIR / SHIPPED[model]
    if not Path(model).is_dir():
        raise ValueError(f"{model!r} is not a local folder: streaming reads the model's files from disk; download it "
                         f"first (huggingface-cli download {model} --local-dir DIR) and pass DIR")
    return Path(model)


def load_pipeline(model: str, dtype: torch.dtype = torch.float32, progress_bar: bool = False, **components):
    """A diffusers pipeline for ``model`` (a shipped name, a ``save_pretrained`` folder or a hub id).

    ``components`` replace the pipeline's own (e.g. ``transformer=`` a converted one, whose
    full-precision weights are then never read).

    Example:
        >>> from sixbit.pipelines import load_pipeline
        >>> pipe = load_pipeline("shapes-wan")
        >>> type(pipe).__name__
        'ShapesWanPipeline'
    """
    if model in SHIPPED:
        return shapes.load_pipeline(SHIPPED[model], torch_dtype=dtype, progress_bar=progress_bar, **components)
    path = Path(model)
    if path.exists():
        index = path / "model_index.json"
        if is_transformer_folder(model):
            raise ValueError(
                f"{model!r} is a transformer folder (config.json, no model_index.json), not a pipeline: generating and "
                "calibrating need the whole pipeline (text encoder, VAE, scheduler); pass the pipeline folder that "
                "save_pretrained wrote (model_index.json beside transformer/)"
            )
        if not index.is_file():
            raise ValueError(f"{model!r} is not a diffusers pipeline folder (no model_index.json); save one with save_pretrained")
        try:
            cls = json.loads(index.read_text()).get("_class_name")
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{str(index)!r} is not valid JSON: {e}") from None
        if cls in SHAPES_CLASSES:
            return shapes.load_pipeline(SHAPES_CLASSES[cls], path=path, torch_dtype=dtype, progress_bar=progress_bar,
                                        **components)
        pipe = DiffusionPipeline.from_pretrained(path, torch_dtype=dtype, local_files_only=True, **components)
        pipe.set_progress_bar_config(disable=not progress_bar)
        return pipe
    if model.count("/") != 1 or model.startswith(("/", ".")):
        raise ValueError(
            f"{model!r} is neither a shipped model ({', '.join(SHIPPED)}), an existing folder, nor a hub id (owner/name)"
        )
    try:
        pipe = DiffusionPipeline.from_pretrained(model, torch_dtype=dtype, **components)
    except (OSError, ValueError) as e:  # huggingface_hub: OSError/ValueError subclasses, network or missing repo
        raise ValueError(
            f"could not load {model!r} from the Hugging Face Hub ({type(e).__name__}: {str(e).splitlines()[0]}); "
            "check the id and your network, or download it where the hub is reachable "
            "(`huggingface-cli download` / save_pretrained) and pass the local folder"
        ) from None
    pipe.set_progress_bar_config(disable=not progress_bar)
    return pipe
