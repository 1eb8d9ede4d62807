"""Training-time data augmentation inside the compiled local step (no host round trip).

The FedMRL authors' code (LipingYi/FedMRL ``experiments/dataset.py``) trains on CIFAR
with, in this order, on the normalised image: ``RandomHorizontalFlip()``,
``RandomErasing(scale=(0.04, 0.2), ratio=(0.5, 2))`` (probability 0.5, value 0) and
``RandomCrop(32, padding=4)`` (zero padding, so the border is the channel mean after
normalisation). ``augment`` does the same per example on a normalised batch, with one
key per example, so a run stays bit-reproducible and resumable (the keys come from the
client's round key). Test images are never augmented.

Sets (``data.augment``):

- ``'none'``: the batch unchanged.
- ``'flip_crop'``: horizontal flip with probability 1/2, then a 32x32 window of the image
  zero-padded by 4 pixels on every side (a shift of -4..4 pixels in each direction).
- ``'flip_crop_erase'``: flip, random erasing, crop, as the authors' code.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

AUGMENTATIONS = ("none", "flip_crop", "flip_crop_erase")
PAD = 4
ERASE_PROB = 0.5
ERASE_SCALE = (0.04, 0.2)
ERASE_RATIO = (0.5, 2.0)


def flip(key: jax.Array, image: jax.Array, prob: float = 0.5) -> jax.Array:
  """Mirrors ``image`` [H, W, C] left-right with probability ``prob``."""
  return jnp.where(jax.random.bernoulli(key, prob), image[:, ::-1], image)


def crop(key: jax.Array, image: jax.Array, pad: int = PAD) -> jax.Array:
  """A random [H, W] window of ``image`` zero-padded by ``pad`` pixels on each side."""
  h, w, c = image.shape
  padded = jnp.pad(image, ((pad, pad), (pad, pad), (0, 0)))
  dy, dx = jax.random.randint(key, (2,), 0, 2 * pad + 1)
  return jax.lax.dynamic_slice(padded, (dy, dx, 0), (h, w, c))


def erase_mask(key: jax.Array, height: int, width: int, *, scale=ERASE_SCALE,
               ratio=ERASE_RATIO) -> jax.Array:
  """bool [H, W]: a rectangle of area ``U(scale) * H * W`` and log-uniform aspect ratio.

  As torchvision's ``RandomErasing``: height ``round(sqrt(area * r))``, width
  ``round(sqrt(area / r))``, placed uniformly inside the image. With the defaults the
  rectangle always fits (at most 20 % of the area, aspect ratio within 2), so the single
  draw equals torchvision's first attempt.
  """
  k_area, k_ratio, k_top, k_left = jax.random.split(key, 4)
  area = jax.random.uniform(k_area, (), minval=scale[0], maxval=scale[1]) * height * width
  r = jnp.exp(jax.random.uniform(k_ratio, (), minval=math.log(ratio[0]),
                                 maxval=math.log(ratio[1])))
  eh = jnp.clip(jnp.round(jnp.sqrt(area * r)), 1, height).astype(jnp.int32)
  ew = jnp.clip(jnp.round(jnp.sqrt(area / r)), 1, width).astype(jnp.int32)
  top = jax.random.randint(k_top, (), 0, height - eh + 1)
  left = jax.random.randint(k_left, (), 0, width - ew + 1)
  rows = jnp.arange(height)[:, None]
  cols = jnp.arange(width)[None, :]
  return (rows >= top) & (rows < top + eh) & (cols >= left) & (cols < left + ew)


def erase(key: jax.Array, image: jax.Array, prob: float = ERASE_PROB) -> jax.Array:
  """Sets a random rectangle of ``image`` [H, W, C] to 0 with probability ``prob``."""
  k_apply, k_mask = jax.random.split(key)
  mask = erase_mask(k_mask, image.shape[0], image.shape[1])
  mask = mask & jax.random.bernoulli(k_apply, prob)
  return jnp.where(mask[..., None], jnp.zeros((), image.dtype), image)


def augment_one(key: jax.Array, image: jax.Array, kind: str) -> jax.Array:
  """One normalised image [H, W, C] through the set ``kind`` (see module docstring)."""
  if kind == "none":
    return image
  k_flip, k_erase, k_crop = jax.random.split(key, 3)
  image = flip(k_flip, image)
  if kind == "flip_crop_erase":
    image = erase(k_erase, image)
  return crop(k_crop, image)


def augment(key: jax.Array, images: jax.Array, kind: str) -> jax.Array:
  """A normalised batch [B, H, W, C] augmented per example (one key each).

  Args:
    key: PRNG key of the batch.
    images: float [B, H, W, C], already normalised (the authors' order).
    kind: one of ``AUGMENTATIONS``.

  Returns:
    an array of the same shape and dtype.
  """
  if kind not in AUGMENTATIONS:
    raise ValueError(f"data.augment={kind!r}; valid choices are {list(AUGMENTATIONS)}")
  if kind == "none":
    return images
  keys = jax.random.split(key, images.shape[0])
  return jax.vmap(augment_one, in_axes=(0, 0, None))(keys, images, kind)
