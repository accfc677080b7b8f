"""Winograd's minimal filtering F(m x m, 3 x 3): a 3x3 stride-1 convolution in a third of the
multiply-adds, declared as three stages that each look like something the search knows.

For an m x m tile of outputs and its (m + 2) x (m + 2) tile of inputs d, with the 3 x 3 filter g,

    Y = A^T [ (G g G^T) * (B^T d B) ] A          (* elementwise, A^T m x a, G a x 3, B^T a x a)

so each tile costs a*a products per pair of channels instead of 9*m*m (36 against 144 for
m = 4). Over channels the elementwise products become a*a independent matrix products:

1. `winograd_input`: V[b, p, c] = (B^T d_p B)[b] for every tile p, two separable reductions of
   a over the zero-padded NHWC input (the first one's result is laid out tile by tile, which the
   second reads contiguously);
2. the products M[b] = V[b] @ U[b], with U = G g G^T computed once from constant weights
   (`transform_weight`): an ordinary batched matmul;
3. `winograd_output`: Y = A^T M_p A gathered back to NHWC, one a x a double reduction per output.

Tuned as three tasks this beats the direct convolution where the image has many tiles;
tuned as one task of five stages it lost (BENCHMARKS.md). The interpolation points are the
usual ones (0, +-1, +-2 for m = 4), which keep the float32 rounding of m = 4 far below the
model tests' tolerance (errors in BENCHMARKS.md).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ansor.te import expr as E
from ansor.te.ops import pad
from ansor.te.tensor import Tensor, compute, reduce_axis

#: The finite interpolation points of F(m, 3) for each supported tile m (infinity is the last).
POINTS: dict[int, tuple[Fraction, ...]] = {
    2: (Fraction(0), Fraction(1), Fraction(-1)),
    4: (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2)),
    6: (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2), Fraction(1, 2), Fraction(-1, 2)),
}
KERNEL = 3  # the filter side these transforms are for


def input_tile(tile: int) -> int:
    """Inputs per tile side for `tile` outputs per side: tile + 2."""
    return tile + KERNEL - 1


def winograd_matrices(tile: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A^T, G, B^T) of F(tile, 3): tile x a, a x 3 and a x a (a = tile + 2), computed exactly
    from fractions (Cook-Toom / Lagrange interpolation at `POINTS[tile]` and infinity)."""
    if tile not in POINTS:
        raise ValueError(f"Winograd tile {tile} not supported: choose one of {sorted(POINTS)}")
    points, alpha = POINTS[tile], input_tile(tile)
    n = len(points)
    at = [[p ** i for p in points] + [Fraction(int(i == tile - 1))] for i in range(tile)]
    scale = [np.prod([points[j] - points[k] for k in range(n) if k != j]) for j in range(n)]
    g = [[points[j] ** k / scale[j] for k in range(KERNEL)] for j in range(n)]
    g.append([Fraction(0)] * (KERNEL - 1) + [Fraction(1)])
    bt = []
    for j in range(n + 1):
        poly = [Fraction(1)]  # prod over k != j of (x - p_k), lowest coefficient first
        for k in range(n):
            if k != j:
                poly = [(poly[i - 1] if i else 0) - (poly[i] * points[k] if i < len(poly) else 0)
                        for i in range(len(poly) + 1)]
        bt.append(poly + [Fraction(0)] * (alpha - len(poly)))
    return tuple(np.array(m, dtype=np.float64) for m in (at, g, bt))  # type: ignore[return-value]


def transform_weight(weight: np.ndarray, tile: int = 4) -> np.ndarray:
    """U = G g G^T of an HWIO 3x3 weight [3, 3, C, K], as [a*a, C, K] in the weight's dtype
    (computed in float64): the right-hand operands of the a*a products."""
    if weight.ndim != 4 or weight.shape[:2] != (KERNEL, KERNEL):
        raise ValueError(f"Winograd needs an HWIO weight of 3x3 filters, got shape {weight.shape}")
    _, g, _ = winograd_matrices(tile)
    alpha = input_tile(tile)
    u = np.einsum("ar,rsck,bs->abck", g, weight.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(alpha * alpha, *weight.shape[2:]).astype(weight.dtype))


def output_tiles(height: int, width: int, tile: int) -> tuple[int, int]:
    """Tiles per column and per row covering a height x width output."""
    return -(-height // tile), -(-width // tile)


def output_extent(height: int, width: int, padding: tuple[int, int, int, int]) -> tuple[int, int]:
    """Output height and width of a 3x3 stride-1 convolution with padding (top, left, bottom, right)."""
    top, left, bottom, right = padding
    return height + top + bottom - KERNEL + 1, width + left + right - KERNEL + 1


def input_padding(height: int, width: int, padding: tuple[int, int, int, int],
                  tile: int) -> tuple[int, int, int, int]:
    """The zeros (top, left, bottom, right) around a height x width input that give every tile
    its full input: the convolution's own padding, and past the bottom/right edge as far as the
    last tile reaches."""
    top, left = padding[0], padding[1]
    rows, cols = output_tiles(*output_extent(height, width, padding), tile)
    return (top, left, rows * tile + KERNEL - 1 - height - top, cols * tile + KERNEL - 1 - width - left)


def winograd_input(data: Tensor, bt: Tensor, padding: tuple[int, int, int, int], tile: int = 4,
                   name: str = "winograd_input") -> Tensor:
    """V [a*a, N*tiles, C] = B^T d B of every input tile d of NHWC `data` zero-padded by
    `padding` (top, left, bottom, right); tile p is (image, tile row, tile column) row-major."""
    n, height, width, channels = data.shape
    alpha = input_tile(tile)
    oh, ow = output_extent(height, width, padding)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{name}: empty output for input {data.shape} and padding {padding}")
    th, tw = output_tiles(oh, ow, tile)
    top, left, bottom, right = input_padding(height, width, padding, tile)
    padded = pad(data, (0, top, left, 0), (0, bottom, right, 0), 0.0, name=f"{name}_pad")
    per_image = th * tw

    def origin(p):  # (image, first row, first column) of tile p
        image, q = (p // per_image, p % per_image) if n > 1 else (0, p)
        return image, q // tw * tile, q % tw * tile

    r1 = reduce_axis(alpha, name="r1")

    def row_pass(p, e, col, c):
        image, y0, x0 = origin(p)
        return E.sum(bt[e, r1] * padded[image, y0 + r1, x0 + col, c], axis=r1)

    rows = compute((n * per_image, alpha, alpha, channels), row_pass, name=f"{name}_rows")
    r2 = reduce_axis(alpha, name="r2")
    return compute((alpha * alpha, n * per_image, channels),
                   lambda b, p, c: E.sum(rows[p, b // alpha, r2, c] * bt[b % alpha, r2], axis=r2),
                   name=name)


def winograd_output(m: Tensor, at: Tensor, shape: tuple[int, int, int], tile: int = 4,
                    name: str = "winograd_output") -> Tensor:
    """Y [N, H, W, K] = A^T M_p A of every tile p of the products `m` [a*a, N*tiles, K], each
    output element one a x a double reduction (`shape` is (N, H, W))."""
    n, height, width = shape
    alpha = input_tile(tile)
    th, tw = output_tiles(height, width, tile)
    r3, r4 = reduce_axis(alpha, name="r3"), reduce_axis(alpha, name="r4")

    def body(i, y, x, k):
        p = (i * th + y // tile) * tw + x // tile if n > 1 else y // tile * tw + x // tile
        return E.sum(at[y % tile, r3] * at[x % tile, r4] * m[r3 * alpha + r4, p, k], axis=[r3, r4])

    return compute((n, height, width, m.shape[2]), body, name=name)
