"""open_clip image-text retriever: images embedded once into the dense index, text queries.

Model = an open_clip architecture name plus ``pretrained``: a public tag (downloaded by
open_clip, so it needs the network or a warm cache) or a local checkpoint file. Random
weights (``pretrained=None``) rank images at random, so they are refused (the error names
``grape.clip_pretrained``) except for ``TINY_CLIP`` or with ``allow_random=True``. Examples:

    ClipRetriever("ViT-B-32", pretrained="laion2b_s34b_b79k")      # public weights
    ClipRetriever("ViT-B-32", pretrained="/models/vit_b_32.pt")     # a local file
    ClipRetriever(TINY_CLIP, seed=0)                                # tiny random model (tests)

``TINY_CLIP`` is a few-layer config registered with open_clip's model-config registry,
so the whole image path (preprocessing, towers, tokenizer, index, rank reward) runs in
tests without any weights. Its scores are meaningless; it checks the wiring.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coevo.config import TINY_CLIP_MODEL
from coevo.retrieval.dense import FrozenRetriever

TINY_CLIP = TINY_CLIP_MODEL  # "coevo-tiny-clip": the params check knows it by the same name
TINY_CLIP_CONFIG: dict[str, Any] = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    # Standard CLIP BPE vocabulary and context so open_clip's default tokenizer applies.
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
_registered: set[str] = set()


def register_model_config(name: str, config: Mapping[str, Any]) -> None:
    """Add an architecture to open_clip's registry (open_clip reads configs from JSON files)."""
    import open_clip

    if name in _registered and open_clip.get_model_config(name) == dict(config):
        return
    folder = Path(tempfile.mkdtemp(prefix="coevo-open-clip-"))
    (folder / f"{name}.json").write_text(json.dumps(dict(config)), encoding="utf-8")
    open_clip.add_model_config(folder / f"{name}.json")
    _registered.add(name)


def load_clip(model_name: str, pretrained: str | None = None, device: str | None = None, seed: int = 0, *,
              allow_random: bool = False):
    """Return ``(model, preprocess, tokenizer)`` in eval mode.

    ``pretrained`` may be a public tag or a local checkpoint path; None gives random
    weights (seeded, so two loads agree), allowed only for ``TINY_CLIP`` or with ``allow_random``.
    """
    import open_clip
    import torch

    if model_name == TINY_CLIP:
        register_model_config(TINY_CLIP, TINY_CLIP_CONFIG)
    if model_name not in open_clip.list_models() and not model_name.startswith(("hf-hub:", "local-dir:")):
        raise ValueError(f"CLIP model {model_name!r} is not an open_clip architecture "
                         f"(e.g. ViT-B-32, {TINY_CLIP}, hf-hub:ORG/NAME, local-dir:PATH)")
    # hf-hub: and local-dir: models carry their weights with them.
    if pretrained is None and not allow_random and model_name != TINY_CLIP and not model_name.startswith(
            ("hf-hub:", "local-dir:")):
        raise ValueError(f"CLIP model {model_name!r} without pretrained weights would rank images at random: set "
                         f"grape.clip_pretrained (a public tag such as openai, or a local checkpoint file); only "
                         f"{TINY_CLIP} runs without weights")
    if pretrained is not None and Path(pretrained).expanduser().suffix in {".pt", ".bin", ".pth", ".safetensors"}:
        if not Path(pretrained).expanduser().is_file():
            raise FileNotFoundError(f"CLIP checkpoint {pretrained}: file does not exist")
        pretrained = str(Path(pretrained).expanduser())
    torch.manual_seed(seed)
    model, _, preprocess = open_clip.create_model_and_transforms(
        model_name, pretrained=pretrained, device=device or "cpu",
        pretrained_text=False,  # no hub download of base text weights: random unless `pretrained` says so
    )
    model.eval()
    return model, preprocess, open_clip.get_tokenizer(model_name)


class ClipRetriever(FrozenRetriever):
    """Frozen open_clip model: images (items' ``image_path``) embedded once, text queries."""

    kind = "clip"

    def __init__(self, model_name: str = "ViT-B-32", pretrained: str | None = None, device: str | None = None,
                 batch_size: int = 32, image_root: str | Path | None = None, seed: int = 0,
                 allow_random: bool = False) -> None:
        super().__init__()
        self.name = f"{model_name}@{pretrained or 'random'}"
        self.device = device or "cpu"
        self.batch_size = batch_size
        self.image_root = Path(image_root) if image_root is not None else None
        self.model, self.preprocess, self.tokenizer = load_clip(model_name, pretrained, self.device, seed,
                                                                allow_random=allow_random)

    def _image_path(self, item: Mapping[str, Any]) -> Path:
        raw = item.get("image_path")
        if not raw:
            raise ValueError(f"item {item.get('item_id')!r}: no image_path (the CLIP retriever needs images)")
        path = Path(str(raw))
        if not path.is_absolute() and self.image_root is not None:
            path = self.image_root / path
        if not path.is_file():
            raise FileNotFoundError(f"item {item.get('item_id')!r}: image {path} does not exist")
        return path

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        out = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                tokens = self.tokenizer(list(texts[start:start + self.batch_size])).to(self.device)
                out.append(self.model.encode_text(tokens, normalize=True).float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.model.text_projection.shape[-1]), np.float32)

    def embed_items(self, items: Sequence[Mapping[str, Any]]) -> np.ndarray:
        import torch
        from PIL import Image
        from tqdm.auto import tqdm

        paths = [self._image_path(it) for it in items]  # fail on a missing image before any work
        out = []
        with torch.inference_mode():
            for start in tqdm(range(0, len(paths), self.batch_size), desc="embedding images",
                              disable=len(paths) <= self.batch_size):
                batch = []
                for path in paths[start:start + self.batch_size]:
                    with Image.open(path) as img:
                        batch.append(self.preprocess(img.convert("RGB")))
                pixels = torch.stack(batch).to(self.device)
                out.append(self.model.encode_image(pixels, normalize=True).float().cpu().numpy())
        return np.concatenate(out).astype(np.float32)
