"""ONNX Resize in numpy: separable resampling, one axis at a time, as a weight matrix per axis.

Every mode ONNX defines for Resize (nearest with its four rounding rules, n-linear, cubic with
its coefficient and `exclude_outside`) maps each output coordinate to a few input taps with
weights; a tap outside the input reads the border value (ONNX pads with edge values). So one
axis's resampling is a matrix of shape (output length, input length), and the whole resize is
that matrix applied along each axis in turn. Coordinates follow the node's
`coordinate_transformation_mode`; `tf_crop_and_resize` (which needs a region of interest) is
refused by the importer before it gets here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["resize", "COORDINATE_MODES", "NEAREST_MODES"]

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def resize(x: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """`x` resampled to `attrs["sizes"]` (see the module)."""
    sizes = [int(d) for d in attrs["sizes"]]
    given = bool(attrs["scales"])
    scales = list(attrs["scales"]) or [out / n for out, n in zip(sizes, x.shape)]
    y = x.astype(np.float64)
    for axis, (n_in, n_out, scale) in enumerate(zip(x.shape, sizes, scales)):
        if n_in == n_out and scale == 1.0:
            continue
        weights = axis_weights(n_in, n_out, float(scale), attrs, exact=n_in * scale if given else n_out)
        y = np.moveaxis(np.tensordot(weights, y, axes=([1], [axis])), 0, axis)
    if np.issubdtype(x.dtype, np.integer):
        y = np.rint(y)
    return y.astype(x.dtype)


def source_coordinate(i: np.ndarray, n_in: int, n_out: int, scale: float, mode: str,
                      exact: float | None = None) -> np.ndarray:
    """The input coordinate an output coordinate `i` samples, as ONNX defines each mode;
    `exact` is the output length before flooring (input x scale when scales are given), which
    align_corners divides by."""
    if mode == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        center = n_in / 2
        return center * (1 - adjustment) + (i + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(i)
    if mode == "align_corners":
        length = n_out if exact is None else exact
        return i * (n_in - 1) / (length - 1) if length > 1 else np.zeros_like(i)
    if mode == "asymmetric":
        return i / scale
    raise ValueError(f"resize: coordinate_transformation_mode {mode!r} is not supported")


def axis_weights(n_in: int, n_out: int, scale: float, attrs: dict[str, Any],
                 exact: float | None = None) -> np.ndarray:
    """The (n_out, n_in) matrix that resamples one axis."""
    x = source_coordinate(np.arange(n_out, dtype=np.float64), n_in, n_out, scale,
                          attrs["coordinate_transformation_mode"], exact)
    weights = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    mode = attrs["mode"]
    if mode == "nearest":
        np.add.at(weights, (rows, np.clip(_nearest(x, attrs["nearest_mode"], scale), 0, n_in - 1)), 1.0)
        return weights
    base = np.floor(x)
    t = x - base
    if mode == "linear":
        taps, coeffs = [0, 1], [1 - t, t]
    else:
        a = float(attrs["cubic_coeff_a"])
        taps, coeffs = [-1, 0, 1, 2], _cubic(t, a)
    coeffs = [np.array(c, dtype=np.float64) for c in coeffs]
    if mode == "cubic" and attrs["exclude_outside"]:
        inside = [((base + k) >= 0) & ((base + k) < n_in) for k in taps]
        coeffs = [c * m for c, m in zip(coeffs, inside)]
        total = sum(coeffs)
        coeffs = [c / np.where(total == 0, 1, total) for c in coeffs]
    for k, c in zip(taps, coeffs):
        np.add.at(weights, (rows, np.clip(base.astype(np.int64) + k, 0, n_in - 1)), c)
    return weights


def _nearest(x: np.ndarray, rule: str, scale: float) -> np.ndarray:
    if rule == "floor":
        return np.floor(x).astype(np.int64)
    if rule == "ceil":
        return np.ceil(x).astype(np.int64)
    frac = x - np.floor(x)
    if rule == "round_prefer_floor":
        return np.where(frac == 0.5, np.floor(x), np.round(x)).astype(np.int64)
    if rule == "round_prefer_ceil":
        return np.where(frac == 0.5, np.ceil(x), np.round(x)).astype(np.int64)
    raise ValueError(f"resize: nearest_mode {rule!r} is not supported")


def _cubic(t: np.ndarray, a: float) -> list[np.ndarray]:
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for fractions `t`."""
    def near(d):  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


