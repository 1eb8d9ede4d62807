"""Training augmentation: shapes, crop windows, flips, erasing fraction, determinism."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.data import augment as aug


def images(b=6, h=32, w=32, c=3):
  return jnp.arange(b * h * w * c, dtype=jnp.float32).reshape(b, h, w, c) / 1000.0 + 1.0


@pytest.mark.parametrize("kind", aug.AUGMENTATIONS)
def test_shapes_dtypes_and_determinism_per_key(kind):
  x = images()
  a = aug.augment(jax.random.PRNGKey(0), x, kind)
  chex.assert_equal_shape([a, x])
  assert a.dtype == x.dtype
  np.testing.assert_array_equal(a, aug.augment(jax.random.PRNGKey(0), x, kind))
  if kind == "none":
    np.testing.assert_array_equal(a, x)
  else:
    assert not np.array_equal(a, aug.augment(jax.random.PRNGKey(1), x, kind))


def test_crop_is_a_shifted_window_with_zero_fill():
  x = images(1)[0]  # all entries > 0, so zeros mark the padding
  seen = set()
  for seed in range(40):
    out = np.asarray(aug.crop(jax.random.PRNGKey(seed), x))
    padded = np.pad(np.asarray(x), ((4, 4), (4, 4), (0, 0)))
    matches = [(dy, dx) for dy in range(9) for dx in range(9)
               if np.array_equal(out, padded[dy:dy + 32, dx:dx + 32])]
    assert len(matches) == 1
    seen.add(matches[0])
  assert len(seen) > 10  # the offsets vary


def test_flip_mirrors_columns_or_keeps_the_image():
  x = images(1)[0]
  outs = [np.asarray(aug.flip(jax.random.PRNGKey(s), x)) for s in range(20)]
  flipped = [np.array_equal(o, np.asarray(x)[:, ::-1]) for o in outs]
  kept = [np.array_equal(o, np.asarray(x)) for o in outs]
  assert all(f or k for f, k in zip(flipped, kept)) and any(flipped) and any(kept)


def test_erasing_zeroes_a_rectangle_of_4_to_20_percent_half_the_time():
  x = images(1)[0]
  fractions = []
  for s in range(200):
    out = np.asarray(aug.erase(jax.random.PRNGKey(s), x))
    zero = np.all(out == 0, axis=-1)
    if zero.any():
      rows, cols = np.flatnonzero(zero.any(1)), np.flatnonzero(zero.any(0))
      assert zero[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].all()  # one rectangle
      fractions.append(zero.mean())
    else:
      np.testing.assert_array_equal(out, x)
  assert 70 < len(fractions) < 130  # p = 0.5
  # area U(0.04, 0.2) of the image, up to rounding the sides to whole pixels
  assert 0.03 <= min(fractions) and max(fractions) <= 0.23
  assert 0.10 < np.mean(fractions) < 0.14


def test_unknown_set_is_named():
  with pytest.raises(ValueError, match="data.augment='rotate'"):
    aug.augment(jax.random.PRNGKey(0), images(), "rotate")
