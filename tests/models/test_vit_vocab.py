"""The patch vocabulary is bounded: it keeps the pixels of the last ``max_images`` images used (LRU), ids are
never reused, and every kept id still maps back to exactly the image processor's pixels."""

from __future__ import annotations

import pytest
import torch

from streetlamp.errors import StreetlampError
from streetlamp.methods.occlusion import Occlusion
from streetlamp.models.adapter import Target
from streetlamp.models.images import FIRST_PATCH_ID, MAX_IMAGES, PatchVocabulary
from streetlamp.models.tiny import tiny_model
from tests.helpers.vit_helpers import random_image, tiny_vit


def _vocab(max_images: int) -> PatchVocabulary:
    model, proc = tiny_model("vit", seed=1)
    return PatchVocabulary(proc, model.config, max_images=max_images)


def _pixels(vocab: PatchVocabulary, seed: int) -> torch.Tensor:
    """The processor's own pixel values of image ``seed`` (not through the vocabulary)."""
    return vocab.processor(images=[random_image(seed)], return_tensors="pt")["pixel_values"]


def test_bounded_lru_and_ids_never_reused() -> None:
    v = _vocab(max_images=3)
    rows = {k: v.encode([random_image(k)])[0][0] for k in range(3)}  # images 0, 1, 2
    v.pixels(torch.tensor([rows[0]]))  # image 0 used again: image 1 is now the least recently used
    rows[3] = v.encode([random_image(3)])[0][0]  # evicts image 1
    assert v.images_kept == 3
    for k in (0, 2, 3):  # kept images read back exactly as the processor made them
        assert torch.equal(v.pixels(torch.tensor([rows[k]])), _pixels(v, k))
    with pytest.raises(StreetlampError, match="released.*keeps the last 3 images.*encode the image again"):
        v.pixels(torch.tensor([rows[1]]))
    with pytest.raises(StreetlampError, match="released"):
        v.patch_pixels(rows[1][5])
    # ids are never handed out twice: a released image's ids never come to mean another image's patches
    all_ids = [i for r in rows.values() for i in r[1:]]
    assert len(set(all_ids)) == len(all_ids) and len(v) == FIRST_PATCH_ID + 4 * v.n_patches
    # a row mixing kept images, [MEAN] and [CLS] reads each patch from its own image
    mixed = [rows[0][0]] + [rows[0][1], rows[3][2], 1] + rows[2][4:]
    pix = v.pixels(torch.tensor([mixed]))
    p = v.patch
    want = _pixels(v, 2).clone()
    want[..., :p, :p] = _pixels(v, 0)[..., :p, :p]
    want[..., :p, p : 2 * p] = _pixels(v, 3)[..., :p, p : 2 * p]
    want[..., :p, 2 * p : 3 * p] = 0  # [MEAN]: 0 after normalisation
    assert torch.equal(pix, want)
    assert torch.equal(v.patch_pixels(rows[3][2])[0], _pixels(v, 3)[0, :, :p, p : 2 * p])
    with pytest.raises(StreetlampError, match="not in this model's patch vocabulary"):
        v.pixels(torch.tensor([[0] + [len(v)] * v.n_patches]))


def test_memory_stays_bounded_over_many_images() -> None:
    """A long-lived server encoding image after image holds at most max_images images' pixels."""
    v = _vocab(max_images=4)
    for k in range(40):
        v.encode([random_image(k)])
        assert v.images_kept == min(k + 1, 4)
    held = sum(t.numel() * t.element_size() for t in v._images.values())
    assert held == 4 * v.n_patches * v.channels * v.patch * v.patch * 4  # float32
    assert MAX_IMAGES >= 16  # the default leaves room for a batch of images in one call


def test_one_call_beyond_the_cap_keeps_its_images() -> None:
    v = _vocab(max_images=2)
    v.encode([random_image(100)])
    rows, _ = v.encode([random_image(k) for k in range(3)])  # 3 images in one call, cap 2
    assert v.images_kept == 3
    for k, row in enumerate(rows):
        assert torch.equal(v.pixels(torch.tensor([row])), _pixels(v, k))


def test_methods_run_on_a_bounded_vocabulary() -> None:
    """Occlusion on an image encoded after the cap was exceeded equals occlusion on a fresh adapter."""
    fresh = tiny_vit(seed=1)
    used = tiny_vit(seed=1)
    used.tokenizer = PatchVocabulary(used.tokenizer.processor, used.hf_model.config, max_images=1)  # type: ignore[attr-defined]
    for k in range(3):
        used.encode([random_image(50 + k)])
    occ = Occlusion()
    a = occ.attribute(fresh, fresh.encode([random_image(7)]), target=Target())[0]
    b = occ.attribute(used, used.encode([random_image(7)]), target=Target())[0]
    assert torch.equal(torch.as_tensor(a.arrays["tokens"]), torch.as_tensor(b.arrays["tokens"]))
    assert used.tokenizer.images_kept == 1  # type: ignore[attr-defined]
