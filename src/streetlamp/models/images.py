"""Images as token sequences for ViT: [CLS] and the image's patches are the "tokens".

A ViT reads pixel values; streetlamp's methods read token ids (they replace, interpolate and batch
them). The bridge is :class:`PatchVocabulary`, the image model's stand-in for a tokenizer: every
image the adapter encodes is cut into its ``P`` patches (the ViT's ``patch_size`` squares, in the
row-major order of its patch embedding), and each patch gets an id in a vocabulary that grows with
the images encoded. Two ids are fixed:

* ``0`` is ``[CLS]``, the ViT's learned class token that the model prepends (its position 0; the
  classifier reads its final state). It is a structural special token: never scored, never perturbed.
* ``1`` is ``[MEAN]``, a patch whose every pixel is the image processor's mean (0 after
  normalisation: mid-grey for ViT's mean 0.5). It is what an occluded patch is replaced by
  (``mask`` / ``unk`` / ``pad`` all resolve to it) and the default baseline of integrated gradients
  (the ``pad`` and ``mask`` baselines embed it at every patch position).

An id row ``[0, p_1, ..., p_P]`` is turned back into pixel values by putting patch ``p_k`` at grid
position ``k`` (:meth:`PatchVocabulary.pixels`), so a row fully describes an image and every method
that builds rows with :meth:`~streetlamp.models.adapter.Inputs.from_ids` works unchanged. Rows must
keep their length (a ViT's positions are a fixed grid): deleting a patch is refused.

The ``embed`` site of a ViT is ``cat([CLS], patch_embeddings(pixels))`` ``[batch, 1 + P, d_model]``,
before the position embeddings are added, as for text models (the token lookup, before positions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..errors import StreetlampError

if TYPE_CHECKING:
    from .trace import Session

CLS_ID, MEAN_ID = 0, 1
CLS_TOKEN, MEAN_TOKEN = "[CLS]", "[MEAN]"
FIRST_PATCH_ID = 2
# suffixes Pillow reads that a user is likely to hand over (a text model is told it got an image)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def looks_like_image_file(x: object) -> bool:
    """True for a PIL image, or a string / path naming an existing file with an image suffix."""
    try:
        from PIL import Image

        if isinstance(x, Image.Image):
            return True
    except ImportError:  # pragma: no cover - Pillow ships with matplotlib
        pass
    if not isinstance(x, (str, Path)):
        return False
    s = str(x)
    if len(s) > 4096 or "\n" in s or not s.lower().endswith(IMAGE_SUFFIXES):
        return False
    return Path(s).expanduser().is_file()


def read_image(path: str | Path) -> Any:
    """The image at ``path`` as an RGB PIL image, fully decoded; one-line errors for a missing or
    unreadable file (checked before anything is written)."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path).expanduser()
    if not p.is_file():
        raise StreetlampError(f"no image file {str(path)!r}: an image model reads an image file (PNG, JPEG, ...)")
    try:
        with Image.open(p) as im:
            im.load()
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise StreetlampError(f"{p} is not a readable image ({why})") from None


def _grid(config: Any) -> tuple[int, int, int]:
    size = config.image_size
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    p = int(config.patch_size if isinstance(config.patch_size, int) else config.patch_size[0])
    return h // p, w // p, p


class PatchVocabulary:
    """The tokenizer of an image model: patch ids <-> pixel values (see the module docstring).

    It offers the part of a Hugging Face tokenizer's interface that streetlamp uses (special-token
    ids and strings, ``convert_ids_to_tokens`` and friends); calling it on text is refused."""

    padding_side = "right"

    def __init__(self, processor: Any, config: Any) -> None:
        self.processor = processor
        self.rows, self.cols, self.patch = _grid(config)
        self.channels = int(config.num_channels)
        self.n_patches = self.rows * self.cols
        self.mean = torch.tensor(processor.image_mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(processor.image_std, dtype=torch.float32).view(-1, 1, 1)
        zero = torch.zeros(2, self.channels, self.patch, self.patch)  # [CLS] (never drawn) and [MEAN]
        self._table: list[torch.Tensor] = [zero]
        self._size = 2

    # -- the tokenizer interface streetlamp uses -------------------------------------------------
    cls_token, cls_token_id = CLS_TOKEN, CLS_ID
    pad_token, pad_token_id = MEAN_TOKEN, MEAN_ID
    mask_token, mask_token_id = MEAN_TOKEN, MEAN_ID
    unk_token, unk_token_id = MEAN_TOKEN, MEAN_ID
    sep_token = sep_token_id = bos_token = bos_token_id = eos_token = eos_token_id = None

    @property
    def all_special_ids(self) -> list[int]:
        return [CLS_ID, MEAN_ID]

    def __len__(self) -> int:
        return self._size

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StreetlampError("this model reads images, not text: give an image file (PNG, JPEG, ...)")

    def label(self, grid_index: int) -> str:
        return f"patch({grid_index // self.cols},{grid_index % self.cols})"

    def _token(self, i: int) -> str:
        if i == CLS_ID:
            return CLS_TOKEN
        if i == MEAN_ID:
            return MEAN_TOKEN
        if not FIRST_PATCH_ID <= i < self._size:
            raise StreetlampError(f"patch id {i} is not in this model's patch vocabulary")
        return self.label((i - FIRST_PATCH_ID) % self.n_patches)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> Any:
        if isinstance(ids, int):
            return self._token(ids)
        return [self._token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        """[CLS] -> 0, [MEAN] -> 1, ``patch(r,c)`` -> the id of that patch of the first image encoded
        (enough for :meth:`~streetlamp.models.adapter.ModelAdapter.special_mask`)."""

        def one(t: str) -> int:
            if t == CLS_TOKEN:
                return CLS_ID
            if t == MEAN_TOKEN:
                return MEAN_ID
            r, c = (int(x) for x in t[len("patch(") : -1].split(","))
            return FIRST_PATCH_ID + r * self.cols + c

        return one(tokens) if isinstance(tokens, str) else [one(t) for t in tokens]

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        return " ".join(tokens)

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str:
        return self.convert_tokens_to_string(self.convert_ids_to_tokens(list(ids)))

    # -- images <-> ids ------------------------------------------------------------------------
    def add(self, pixel_values: torch.Tensor) -> list[list[int]]:
        """Register images ``[batch, C, H, W]`` (processor output); their id rows ``[CLS, patches]``."""
        b = pixel_values.shape[0]
        p, r, c = self.patch, self.rows, self.cols
        x = pixel_values.detach().float().cpu().reshape(b, self.channels, r, p, c, p)
        patches = x.permute(0, 2, 4, 1, 3, 5).reshape(b * r * c, self.channels, p, p)
        start = self._size
        self._table.append(patches)
        self._size += b * r * c
        return [[CLS_ID] + list(range(start + k * r * c, start + (k + 1) * r * c)) for k in range(b)]

    def pixels(self, ids: torch.Tensor) -> torch.Tensor:
        """Pixel values ``[batch, C, H, W]`` (normalised, float32, CPU) of id rows ``[batch, 1 + P]``."""
        ids = ids.cpu()
        if ids.dim() != 2 or ids.shape[1] != 1 + self.n_patches:
            raise StreetlampError(
                f"an image is [CLS] + {self.n_patches} patches; got rows of {ids.shape[-1]} ids "
                "(patches cannot be deleted or added: replace them)"
            )
        if bool((ids[:, 0] != CLS_ID).any()) or bool((ids[:, 1:] == CLS_ID).any()):
            raise StreetlampError("[CLS] is the ViT's own first token: it cannot be moved or replaced")
        if len(self._table) > 1:
            self._table = [torch.cat(self._table)]
        pick = self._table[0][ids[:, 1:]]  # [batch, P, C, p, p]
        b, p, r, c = ids.shape[0], self.patch, self.rows, self.cols
        return pick.reshape(b, r, c, self.channels, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, -1, r * p, c * p)

    def patch_pixels(self, i: int) -> torch.Tensor:
        """Patch ``i`` alone as a one-patch image ``[1, C, p, p]`` (its embedding is that patch's)."""
        if len(self._table) > 1:
            self._table = [torch.cat(self._table)]
        return self._table[0][i][None]

    def rgb(self, ids: torch.Tensor) -> np.ndarray:
        """The image of one id row ``[1 + P]`` as RGB in [0, 1], ``[H, W, C]`` (for figures)."""
        x = self.pixels(ids.view(1, -1))[0] * self.std + self.mean
        return x.clamp(0, 1).permute(1, 2, 0).numpy()

    def encode(self, images: Sequence[Any]) -> tuple[list[list[int]], torch.Tensor]:
        """Run the image processor on PIL images; their id rows and pixel values."""
        pv = self.processor(images=list(images), return_tensors="pt")["pixel_values"]
        return self.add(pv), pv


def token_embeddings(embeddings: nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """The ViT ``embed`` site for pixel values: ``cat([CLS], patch_embeddings(x))`` (no positions)."""
    emb: Any = embeddings
    patches = emb.patch_embeddings(pixel_values)
    return torch.cat([emb.cls_token.expand(patches.shape[0], -1, -1).to(patches.dtype), patches], 1)


def vit_embed_hook(session: Session) -> Callable:
    """Forward hook on ``ViTEmbeddings`` exposing the ``embed`` site (before the position embeddings).

    The output is rebuilt as the model builds it (``dropout(embed + position_embeddings)``), from the
    site's possibly edited value, so the rest of the forward pass depends on the recorded tensor."""

    def hook(module: nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        emb: Any = module
        pixel = args[0] if args else kwargs["pixel_values"]
        if kwargs.get("bool_masked_pos") is not None or kwargs.get("interpolate_pos_encoding"):
            raise StreetlampError("streetlamp runs ViT on images of its own size, without masked patches")
        e = session.site("embed", token_embeddings(module, pixel))
        return emb.dropout(e + emb.position_embeddings)

    return hook
