"""Ready operators (ansor.te.ops), checked with the reference evaluator against independent numpy
implementations, plus the declaration-time errors of the operators and of the language."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ansor import te
from ansor.te import ops
from ansor.te.evaluate import evaluate, random_inputs

RTOL, ATOL = 1e-4, 1e-5


def run(out, *placeholders, seed=0):
    values = random_inputs(placeholders, seed=seed)
    (result,) = evaluate([out], dict(zip(placeholders, values)))
    assert result.shape == out.shape
    assert result.dtype == np.dtype(out.dtype)
    return result, [v.astype(np.float64) if v.dtype.kind == "f" else v for v in values]


def stage_names(out) -> list[str]:
    """Names of every compute stage feeding `out`, depth first."""
    names, stack, seen = [], [out], set()
    while stack:
        t = stack.pop()
        if id(t.op) in seen or isinstance(t.op, te.PlaceholderOp):
            continue
        seen.add(id(t.op))
        names.append(t.name)
        stack.extend(t.op.input_tensors())
    return names


# ---------------------------------------------------------------------------------------------
# independent references

def ref_conv2d_nchw(x, w, stride, padding, dilation, groups):
    """Sliding-window convolution: for each kernel tap, a strided window times the tap."""
    sh, sw = stride
    dh, dw = dilation
    pt, pl, pb, pr = padding
    n, c, h, wd = x.shape
    o, cpg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    opg = o // groups
    out = np.zeros((n, o, oh, ow))
    for g in range(groups):
        xs = xp[:, g * cpg:(g + 1) * cpg]
        ws = w[g * opg:(g + 1) * opg]
        for ry in range(kh):
            for rx in range(kw):
                win = xs[:, :, ry * dh: ry * dh + sh * (oh - 1) + 1: sh,
                         rx * dw: rx * dw + sw * (ow - 1) + 1: sw]
                out[:, g * opg:(g + 1) * opg] += np.einsum("nchw,oc->nohw", win, ws[:, :, ry, rx])
    return out


def ref_conv2d_transpose(x, w, stride, padding, output_padding):
    """The definition: every input pixel scatters kernel * value into the output."""
    n, ci, h, wd = x.shape
    _, co, kh, kw = w.shape
    (sh, sw), (ph, pw), (oph, opw) = stride, padding, output_padding
    full = np.zeros((n, co, (h - 1) * sh + kh + oph, (wd - 1) * sw + kw + opw))
    for i in range(h):
        for j in range(wd):
            full[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw] += np.einsum(
                "nc,cokl->nokl", x[:, :, i, j], w)
    oh = (h - 1) * sh - 2 * ph + kh + oph
    ow = (wd - 1) * sw - 2 * pw + kw + opw
    return full[:, :, ph:ph + oh, pw:pw + ow]


def ref_pool(x, kernel, stride, padding, kind):
    kh, kw = kernel
    sh, sw = stride
    pt, pl, pb, pr = padding
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
    oh = (xp.shape[2] - kh) // sh + 1
    ow = (xp.shape[3] - kw) // sw + 1
    out = np.empty(x.shape[:2] + (oh, ow))
    for y in range(oh):
        for z in range(ow):
            win = xp[:, :, y * sh:y * sh + kh, z * sw:z * sw + kw]
            if kind == "max":
                out[:, :, y, z] = win.max(axis=(2, 3))
            else:
                out[:, :, y, z] = win.sum(axis=(2, 3)) / (kh * kw)
    return out


# ---------------------------------------------------------------------------------------------
# linear algebra

@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul(ta, tb):
    A = te.placeholder((7, 5) if ta else (5, 7), name="A")
    B = te.placeholder((9, 7) if tb else (7, 9), name="B")
    C = ops.matmul(A, B, transpose_a=ta, transpose_b=tb)
    assert C.shape == (5, 9) and C.name == "matmul"
    got, (a, b) = run(C, A, B)
    np.testing.assert_allclose(got, (a.T if ta else a) @ (b.T if tb else b), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("tb", [False, True])
def test_batch_matmul(tb):
    A = te.placeholder((3, 4, 6), name="A")
    B = te.placeholder((3, 5, 6) if tb else (3, 6, 5), name="B")
    got, (a, b) = run(ops.batch_matmul(A, B, transpose_b=tb), A, B)
    np.testing.assert_allclose(got, np.matmul(a, b.transpose(0, 2, 1) if tb else b), rtol=RTOL,
                               atol=ATOL)


def test_batch_matmul_broadcasts_batch_of_one():
    A = te.placeholder((1, 4, 6), name="A")
    B = te.placeholder((3, 6, 5), name="B")
    got, (a, b) = run(ops.batch_matmul(A, B), A, B)
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=RTOL, atol=ATOL)


def test_dense_with_and_without_bias():
    X = te.placeholder((4, 8), name="X")
    W = te.placeholder((3, 8), name="W")
    b = te.placeholder((3,), name="b")
    plain = ops.dense(X, W)
    got, (x, w) = run(plain, X, W)
    np.testing.assert_allclose(got, x @ w.T, rtol=RTOL, atol=ATOL)
    biased = ops.dense(X, W, b)
    assert stage_names(biased) == ["dense_bias", "dense"]
    got, (x, w, bb) = run(biased, X, W, b)
    np.testing.assert_allclose(got, x @ w.T + bb, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------------------------------
# elementwise

@pytest.mark.parametrize("axis", [1, -1, 0])
def test_bias_add(axis):
    X = te.placeholder((2, 3, 4), name="X")
    b = te.placeholder((X.shape[axis],), name="b")
    got, (x, bb) = run(ops.bias_add(X, b, axis=axis), X, b)
    shape = [1, 1, 1]
    shape[axis] = -1
    np.testing.assert_allclose(got, x + bb.reshape(shape), rtol=RTOL, atol=ATOL)


def test_relu_float_and_int():
    X = te.placeholder((3, 5), name="X")
    got, (x,) = run(ops.relu(X), X)
    np.testing.assert_array_equal(got, np.maximum(x, 0).astype(np.float32))
    Xi = te.placeholder((6,), "int32", name="Xi")
    got, (xi,) = run(ops.relu(Xi), Xi)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.maximum(xi, 0))


def test_gelu():
    X = te.placeholder((4, 6), name="X")
    values = np.linspace(-4, 4, 24, dtype=np.float32).reshape(4, 6)
    (got,) = evaluate([ops.gelu(X)], {X: values})
    erf = np.vectorize(math.erf)
    v = values.astype(np.float64)
    np.testing.assert_allclose(got, 0.5 * v * (1 + erf(v / math.sqrt(2))), rtol=RTOL, atol=ATOL)


def test_add_multiply_broadcast():
    A = te.placeholder((2, 3, 4), name="A")
    B = te.placeholder((3, 1), name="B")
    got, (a, b) = run(ops.add(A, B), A, B)
    np.testing.assert_allclose(got, a + b, rtol=RTOL, atol=ATOL)
    got, (a, b) = run(ops.multiply(B, A), A, B)
    np.testing.assert_allclose(got, a * b, rtol=RTOL, atol=ATOL)
    got, (a,) = run(ops.multiply(A, 3.0), A)
    np.testing.assert_allclose(got, a * 3, rtol=RTOL, atol=ATOL)
    got, (a, b) = run(ops.subtract(A, B), A, B)
    np.testing.assert_allclose(got, a - b, rtol=RTOL, atol=ATOL)


def test_pad():
    X = te.placeholder((2, 3), name="X")
    P = ops.pad(X, (1, 0), (2, 3), value=7.0)
    assert P.shape == (5, 6)
    got, (x,) = run(P, X)
    np.testing.assert_allclose(got, np.pad(x, ((1, 2), (0, 3)), constant_values=7.0), rtol=RTOL)
    P2 = ops.pad(X, (1, 1))  # pad_after defaults to pad_before
    got, (x,) = run(P2, X)
    np.testing.assert_allclose(got, np.pad(x, 1), rtol=RTOL)


# ---------------------------------------------------------------------------------------------
# convolutions

CONV_CASES = [
    # (n, c, h, w), (o, kh, kw), stride, padding, dilation, groups
    ((1, 3, 7, 7), (4, 3, 3), 1, 0, 1, 1),
    ((2, 4, 9, 8), (6, 3, 3), 2, 1, 1, 2),
    ((1, 4, 10, 9), (4, 3, 2), (2, 1), (1, 2, 0, 1), (2, 1), 4),
    ((2, 6, 8, 8), (9, 1, 1), 1, 0, 1, 3),
    ((1, 2, 6, 7), (3, 5, 3), (1, 2), (2, 1), (1, 2), 1),
]


def _norm_conv_args(stride, padding, dilation):
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    pad4 = padding if isinstance(padding, tuple) and len(padding) == 4 else pair(padding) * 2
    return pair(stride), pad4, pair(dilation)


@pytest.mark.parametrize("dshape,wshape,stride,padding,dilation,groups", CONV_CASES)
def test_conv2d_nchw(dshape, wshape, stride, padding, dilation, groups):
    n, c, h, w = dshape
    o, kh, kw = wshape
    X = te.placeholder(dshape, name="X")
    W = te.placeholder((o, c // groups, kh, kw), name="W")
    Y = ops.conv2d(X, W, stride, padding, dilation, groups)
    s, p, d = _norm_conv_args(stride, padding, dilation)
    got, (x, wt) = run(Y, X, W)
    np.testing.assert_allclose(got, ref_conv2d_nchw(x, wt, s, p, d, groups), rtol=RTOL, atol=ATOL)
    assert ("conv2d_pad" in stage_names(Y)) == any(p)


@pytest.mark.parametrize("dshape,wshape,stride,padding,dilation,groups", CONV_CASES)
def test_conv2d_nhwc(dshape, wshape, stride, padding, dilation, groups):
    n, c, h, w = dshape
    o, kh, kw = wshape
    X = te.placeholder((n, h, w, c), name="X")
    W = te.placeholder((kh, kw, c // groups, o), name="W")
    Y = ops.conv2d(X, W, stride, padding, dilation, groups, layout="NHWC")
    s, p, d = _norm_conv_args(stride, padding, dilation)
    got, (x, wt) = run(Y, X, W)
    ref = ref_conv2d_nchw(x.transpose(0, 3, 1, 2), wt.transpose(3, 2, 0, 1), s, p, d, groups)
    np.testing.assert_allclose(got, ref.transpose(0, 2, 3, 1), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mult", [1, 2])
def test_depthwise_conv2d(mult):
    X = te.placeholder((2, 3, 8, 7), name="X")
    W = te.placeholder((3 * mult, 1, 3, 3), name="W")
    Y = ops.depthwise_conv2d(X, W, stride=2, padding=1, dilation=1)
    got, (x, w) = run(Y, X, W)
    np.testing.assert_allclose(got, ref_conv2d_nchw(x, w, (2, 2), (1, 1, 1, 1), (1, 1), 3),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("stride,padding,output_padding,kernel", [
    (1, 0, 0, (3, 3)), (2, 1, 1, (3, 3)), (2, 0, 0, (4, 2)), ((3, 2), (1, 0), (2, 1), (3, 3)),
    (2, 2, 0, (2, 2)),
])
def test_conv2d_transpose(stride, padding, output_padding, kernel):
    X = te.placeholder((2, 3, 4, 5), name="X")
    W = te.placeholder((3, 2) + kernel, name="W")
    Y = ops.conv2d_transpose(X, W, stride, padding, output_padding)
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    got, (x, w) = run(Y, X, W)
    ref = ref_conv2d_transpose(x, w, pair(stride), pair(padding), pair(output_padding))
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)


def test_conv2d_transpose_multiplies_no_inserted_zero():
    """Stride 2, 4x4 kernel: each output takes 2x2 taps per input channel, not 4x4."""
    from ansor.dag import ComputeDAG

    X = te.placeholder((1, 8, 4, 4), name="X")
    W = te.placeholder((8, 6, 4, 4), name="W")
    Y = ops.conv2d_transpose(X, W, stride=2, padding=1)
    assert Y.shape == (1, 6, 8, 8)
    assert ComputeDAG([X, W, Y]).flop == 2 * 6 * 8 * 8 * 8 * (2 * 2)


# ---------------------------------------------------------------------------------------------
# pooling

@pytest.mark.parametrize("kernel,stride,padding", [
    (2, None, 0), (3, 2, 1), ((3, 2), (1, 2), (1, 0)), (3, 1, (1, 0, 1, 1)),
])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool2d(kernel, stride, padding, kind):
    X = te.placeholder((2, 3, 7, 8), name="X")
    fn = ops.max_pool2d if kind == "max" else ops.avg_pool2d
    Y = fn(X, kernel, stride, padding)
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    k = pair(kernel)
    s = k if stride is None else pair(stride)
    p = padding if isinstance(padding, tuple) and len(padding) == 4 else pair(padding) * 2
    got, (x,) = run(Y, X)
    np.testing.assert_allclose(got, ref_pool(x, k, s, p, kind), rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------------------------------
# normalization

@pytest.mark.parametrize("shape,axis", [((7,), -1), ((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1)])
def test_softmax(shape, axis):
    X = te.placeholder(shape, name="X")
    Y = ops.softmax(X, axis=axis)
    assert sorted(stage_names(Y)) == ["softmax", "softmax_exp", "softmax_max", "softmax_sum"]
    got, (x,) = run(Y, X)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=axis, keepdims=True), rtol=RTOL, atol=ATOL)


def test_softmax_is_stable_for_large_inputs():
    X = te.placeholder((2, 3), name="X")
    x = np.array([[1000, 1001, 1002], [-1000, 0, 1000]], dtype=np.float32)
    (got,) = evaluate([ops.softmax(X)], {X: x})
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=RTOL)


@pytest.mark.parametrize("shape,axis,affine", [((4, 6), -1, True), ((3, 5, 2), 1, True),
                                               ((8,), 0, False)])
def test_layer_norm(shape, axis, affine):
    X = te.placeholder(shape, name="X")
    G = te.placeholder((shape[axis],), name="gamma")
    B = te.placeholder((shape[axis],), name="beta")
    Y = ops.layer_norm(X, G if affine else None, B if affine else None, axis=axis, eps=1e-5)
    places = (X, G, B) if affine else (X,)
    got, vals = run(Y, *places)
    x = vals[0]
    mean = x.mean(axis=axis, keepdims=True)
    ref = (x - mean) / np.sqrt(x.var(axis=axis, keepdims=True) + 1e-5)
    if affine:
        bshape = [1] * len(shape)
        bshape[axis] = -1
        ref = ref * vals[1].reshape(bshape) + vals[2].reshape(bshape)
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=1e-4)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4, 5)])
def test_norm2(shape):
    X = te.placeholder(shape, name="X")
    Y = ops.norm2(X)
    assert Y.shape == (1,)
    assert sorted(stage_names(Y)) == ["norm2", "norm2_sum_sq"]
    got, (x,) = run(Y, X)
    np.testing.assert_allclose(got, [np.linalg.norm(x.ravel())], rtol=RTOL)


def test_ops_keep_float64():
    A = te.placeholder((3, 4), "float64", name="A")
    B = te.placeholder((4, 2), "float64", name="B")
    got, (a, b) = run(ops.matmul(A, B), A, B)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, a @ b, rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# declaration-time errors

def test_matmul_k_mismatch_names_tensors_and_dimensions():
    A = te.placeholder((4, 5), name="A")
    B = te.placeholder((6, 3), name="B")
    with pytest.raises(ValueError, match=r"'A' dimension 1 has 5 but 'B' dimension 0 has 6"):
        ops.matmul(A, B)
    with pytest.raises(ValueError, match=r"'A'.*3 dimensions|must have 2 dimensions"):
        ops.matmul(te.placeholder((1, 4, 5), name="A"), B)
    with pytest.raises(TypeError, match="dtype"):
        ops.matmul(A, te.placeholder((5, 3), "float64", name="B"))


def test_batch_matmul_and_dense_mismatch():
    with pytest.raises(ValueError, match=r"batch extents differ.*'A' dimension 0 has 2"):
        ops.batch_matmul(te.placeholder((2, 3, 4), name="A"), te.placeholder((3, 4, 5), name="B"))
    with pytest.raises(ValueError, match=r"'W' dimension 1 has 7"):
        ops.dense(te.placeholder((2, 8), name="X"), te.placeholder((3, 7), name="W"))
    with pytest.raises(ValueError, match=r"bias 'b' dimension 0 has extent 4"):
        ops.dense(te.placeholder((2, 8), name="X"), te.placeholder((3, 8), name="W"),
                  te.placeholder((4,), name="b"))


def test_conv2d_groups_must_divide_channels():
    X = te.placeholder((1, 6, 8, 8), name="data")
    with pytest.raises(ValueError, match=r"'data' dimension 1 has 6 channels.*groups=4"):
        ops.conv2d(X, te.placeholder((4, 1, 3, 3), name="W"), groups=4)
    with pytest.raises(ValueError, match=r"weight 'W' dimension 0 has 5 output channels"):
        ops.conv2d(X, te.placeholder((5, 2, 3, 3), name="W"), groups=3)


def test_conv2d_wrong_weight_shape():
    X = te.placeholder((1, 6, 8, 8), name="data")
    with pytest.raises(ValueError, match=r"'W' dimension 1 has extent 6, expected 3"):
        ops.conv2d(X, te.placeholder((4, 6, 3, 3), name="W"), groups=2)
    with pytest.raises(ValueError, match=r"'W' dimension 2 has extent 5, expected 6"):
        ops.conv2d(te.placeholder((1, 8, 8, 6), name="data"),
                   te.placeholder((3, 3, 5, 4), name="W"), layout="NHWC")
    with pytest.raises(ValueError, match=r"weight 'W' must have 4 dimensions"):
        ops.conv2d(X, te.placeholder((4, 6, 3), name="W"))
    with pytest.raises(ValueError, match=r"'data' dimension 2 has extent 8.*window 9"):
        ops.conv2d(X, te.placeholder((4, 6, 9, 3), name="W"))
    with pytest.raises(ValueError, match="layout"):
        ops.conv2d(X, te.placeholder((4, 6, 3, 3), name="W"), layout="NCWH")
    with pytest.raises(ValueError, match="stride"):
        ops.conv2d(X, te.placeholder((4, 6, 3, 3), name="W"), stride=0)
    with pytest.raises(ValueError, match="padding"):
        ops.conv2d(X, te.placeholder((4, 6, 3, 3), name="W"), padding=(1, 2, 3))


def test_other_op_argument_errors():
    X = te.placeholder((1, 3, 5, 5), name="data")
    with pytest.raises(ValueError, match=r"'W' dimension 0 has 4 channels.*3 channels of 'data'"):
        ops.depthwise_conv2d(X, te.placeholder((4, 1, 3, 3), name="W"))
    with pytest.raises(ValueError, match=r"'W' dimension 0 has extent 2, expected 3"):
        ops.conv2d_transpose(X, te.placeholder((2, 3, 3, 3), name="W"))
    with pytest.raises(ValueError, match="output_padding"):
        ops.conv2d_transpose(X, te.placeholder((3, 2, 3, 3), name="W"), stride=2,
                             output_padding=2)
    with pytest.raises(ValueError, match=r"axis 2 is out of range for 'x'"):
        ops.softmax(te.placeholder((3, 4), name="x"), axis=2)
    with pytest.raises(TypeError, match=r"'xi' must have a float dtype"):
        ops.softmax(te.placeholder((3, 4), "int32", name="xi"))
    with pytest.raises(ValueError, match=r"gamma 'g' dimension 0 has extent 3"):
        ops.layer_norm(te.placeholder((2, 4), name="x"), te.placeholder((3,), name="g"), None)
    with pytest.raises(ValueError, match=r"bias 'b' dimension 0 has extent 2.*dimension 1 has 3"):
        ops.bias_add(X, te.placeholder((2,), name="b"), axis=1)
    with pytest.raises(ValueError, match=r"do not broadcast"):
        ops.add(te.placeholder((2, 3), name="a"), te.placeholder((4,), name="b"))
    with pytest.raises(ValueError, match="pad_before"):
        ops.pad(X, (1, 1), (1, 1))
    with pytest.raises(ValueError, match=r"'data' dimension 2 has extent 5.*window 6"):
        ops.max_pool2d(X, 6)
    with pytest.raises(TypeError, match="must be a te.Tensor"):
        ops.relu(np.zeros(3))


def test_unguarded_out_of_bounds_read_is_rejected():
    A = te.placeholder((8,), name="A")
    with pytest.raises(IndexError, match=r"reads tensor 'A' out of bounds in dimension 0"):
        te.compute((8,), lambda i: A[i + 1], name="shift")
    # the same read is accepted when guarded
    te.compute((8,), lambda i: te.if_then_else(i < 7, A[i + 1], 0.0), name="shift")


def test_reduction_must_be_whole_body():
    A = te.placeholder((4, 5), name="A")
    k = te.reduce_axis(5, "k")
    with pytest.raises(ValueError, match=r"compute 'rowsum'.*whole body"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) + 1.0, name="rowsum")


def test_unknown_dtype_is_rejected():
    with pytest.raises(TypeError, match="complex64"):
        te.placeholder((2,), "complex64", name="A")


def test_wrong_number_of_indices_names_tensor():
    A = te.placeholder((4, 5), name="A")
    with pytest.raises(IndexError, match=r"tensor 'A' has 2 dimensions.*1 indices"):
        te.compute((4,), lambda i: A[i], name="bad")
