"""Images as token sequences for ViT: [CLS] and the image's patches are the "tokens".

A ViT reads pixel values; streetlamp's methods read token ids (they replace, interpolate and batch
them). The bridge is :class:`PatchVocabulary`, the image model's stand-in for a tokenizer: every
image the adapter encodes is cut into its ``P`` patches (the ViT's ``patch_size`` squares, in the
row-major order of its patch embedding), and each patch gets an id: image ``n`` (counted from 0 over
the adapter's lifetime) owns ids ``2 + n P .. 2 + (n + 1) P - 1``. Ids are never reused. The pixels
are kept for the last :data:`MAX_IMAGES` images used (encoded, or read back by :meth:`PatchVocabulary.pixels`),
least recently used first out, so a long-lived ``serve`` holds at most ``MAX_IMAGES`` images' pixels
(``MAX_IMAGES x 3 x 224 x 224`` float32 = 38 MB for ViT-Base) however many it has explained; the
images of one ``encode`` call are all kept even beyond the cap. An id of a released image is one
clear error (encode the image again), never another image's patch. Two ids are fixed:

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

from collections import OrderedDict
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
# images whose pixels a PatchVocabulary keeps (least recently used out; see the module docstring)
MAX_IMAGES = 64
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

    def __init__(self, processor: Any, config: Any, max_images: int = MAX_IMAGES) -> None:
        if max_images < 1:
            raise StreetlampError(f"max_images must be >= 1 (got {max_images})")
        self.processor = processor
        self.max_images = max_images
        self.rows, self.cols, self.patch = _grid(config)
        self.channels = int(config.num_channels)
        self.n_patches = self.rows * self.cols
        self.mean = torch.tensor(processor.image_mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(processor.image_std, dtype=torch.float32).view(-1, 1, 1)
        self._fixed = torch.zeros(2, self.channels, self.patch, self.patch)  # [CLS] (never drawn) and [MEAN]
        self._images: OrderedDict[int, torch.Tensor] = OrderedDict()  # image number -> [P, C, p, p], LRU order
        self._n_images = 0  # images ever encoded: the next image's number

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
        """Ids handed out so far (released images' ids included: ids are never reused)."""
        return FIRST_PATCH_ID + self._n_images * self.n_patches

    @property
    def images_kept(self) -> int:
        """Images whose pixels are held now (at most ``max_images``, or the last ``encode`` call's)."""
        return len(self._images)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StreetlampError("this model reads images, not text: give an image file (PNG, JPEG, ...)")

    def label(self, grid_index: int) -> str:
        return f"patch({grid_index // self.cols},{grid_index % self.cols})"

    def _token(self, i: int) -> str:
        if i == CLS_ID:
            return CLS_TOKEN
        if i == MEAN_ID:
            return MEAN_TOKEN
        if not FIRST_PATCH_ID <= i < len(self):
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
        p, r, c, P = self.patch, self.rows, self.cols, self.n_patches
        x = pixel_values.detach().float().cpu().reshape(b, self.channels, r, p, c, p)
        patches = x.permute(0, 2, 4, 1, 3, 5).reshape(b, P, self.channels, p, p)
        first = self._n_images
        for k in range(b):
            self._images[first + k] = patches[k].clone()
        self._n_images += b
        while len(self._images) > max(self.max_images, b):
            self._images.popitem(last=False)
        return [
            [CLS_ID] + list(range(FIRST_PATCH_ID + n * P, FIRST_PATCH_ID + (n + 1) * P))
            for n in range(first, first + b)
        ]

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """The patches ``[*ids.shape, C, p, p]`` of ids (fixed or kept images'); marks their images used."""
        ids = ids.long()
        if bool((ids < 0).any()) or bool((ids >= len(self)).any()):
            bad = int(ids[(ids < 0) | (ids >= len(self))][0])
            raise StreetlampError(f"patch id {bad} is not in this model's patch vocabulary")
        n = torch.where(ids >= FIRST_PATCH_ID, (ids - FIRST_PATCH_ID) // self.n_patches, -1)
        used = sorted({int(v) for v in n.unique().tolist()} - {-1})
        gone = [m for m in used if m not in self._images]
        if gone:
            raise StreetlampError(
                f"patch ids of image {gone[0]} were released (the patch vocabulary keeps the last {self.max_images} "
                "images used): encode the image again"
            )
        for m in used:
            self._images.move_to_end(m)
        table = torch.cat([self._fixed] + [self._images[m] for m in used])
        slot = torch.searchsorted(torch.tensor(used, dtype=torch.long), n.clamp(min=0))
        row = torch.where(
            ids >= FIRST_PATCH_ID, FIRST_PATCH_ID + slot * self.n_patches + (ids - FIRST_PATCH_ID) % self.n_patches, ids
        )
        return table[row]

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
        pick = self._lookup(ids[:, 1:])  # [batch, P, C, p, p]
        b, p, r, c = ids.shape[0], self.patch, self.rows, self.cols
        return pick.reshape(b, r, c, self.channels, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, -1, r * p, c * p)

    def patch_pixels(self, i: int) -> torch.Tensor:
        """Patch ``i`` alone as a one-patch image ``[1, C, p, p]`` (its embedding is that patch's)."""
        return self._lookup(torch.tensor([int(i)]))

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
