"""PyTorch's own operator samples through `from_torch` and the compiler: never a wrong answer.

Every sample of a core ATen operator either matches PyTorch eager or is refused with a reason
naming the ATen operator. The suite runs the first two float32 samples of every core OpInfo
(all of them: `python -m ansor.graph.torch_conformance`), then the operators the importer
composes or adds, each against PyTorch on inputs chosen for their edge cases.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal needs it for op_db

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from ansor.graph import UnsupportedOperatorError, from_torch  # noqa: E402
from ansor.graph.compiled import build_model  # noqa: E402
from ansor.graph.torch_conformance import core_aten_operators, core_opinfos, run_sample, samples  # noqa: E402


def test_two_samples_of_every_core_operator_give_no_wrong_answer():
    verdicts = [run_sample(s) for s in samples(limit=2)]
    wrong = [v for v in verdicts if v.status == "wrong"]
    assert not wrong, "\n".join(f"{v.case}: {v.reason}" for v in wrong)
    unnamed = [v for v in verdicts if v.status == "refused" and "aten." not in v.reason]
    assert not unnamed, "refusals must name the ATen operator: " + "; ".join(
        f"{v.case}: {v.reason}" for v in unnamed[:5])
    passed = sum(v.status == "pass" for v in verdicts)
    assert passed >= 0.85 * sum(v.status != "skipped" for v in verdicts), passed


def test_the_core_set_is_pytorchs_tagged_operators():
    core = core_aten_operators()
    assert {"convolution", "_softmax", "native_layer_norm", "max_pool2d_with_indices"} <= core
    assert "linear" not in core and "matmul" not in core  # decomposed before the core set
    names = {name for _, name in core_opinfos()}
    assert "convolution" in names and "upsample_nearest2d" in names
    assert not any(op.name.startswith("masked.") for op, _ in core_opinfos())


# ------------------------------------------------------------------------------ against PyTorch


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def compiled_matches_eager(fn, *inputs, rtol=1e-5, atol=1e-6):
    """Import `fn` on `inputs`, build it with default schedules, and compare every output
    with PyTorch eager: shape, dtype, values (integers exactly)."""
    module = Fn(fn)
    with torch.no_grad():
        expected = module(*[t.clone() for t in inputs])
    expected = torch.utils._pytree.tree_leaves(expected)  # (values, indices) pairs flattened
    model = build_model(from_torch(module, [t.clone() for t in inputs]), None, verbose=False)
    got = model(*[t.numpy() for t in inputs])
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = e.numpy()
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, g.dtype, e.shape, e.dtype)
        if e.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, e)
    return model


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


ELEMENTWISE = {
    "trig": lambda x: torch.sin(x) + torch.cos(x) * torch.atan(x) - torch.asinh(x) + torch.tanh(torch.sinh(x)),
    "rounding": lambda x: torch.floor(x * 3) + torch.ceil(x * 3) + torch.round(x * 3) + torch.trunc(x * 3),
    "round_decimals": lambda x: torch.round(x * 100, decimals=-1) + torch.round(x, decimals=2),
    "logs": lambda x: torch.log2(x.abs() + 0.5) + torch.log10(x.abs() + 0.5) + torch.reciprocal(x + 3),
    "sign": lambda x: torch.sign(x) * x,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "elu_selu_celu": lambda x: F.elu(x, 0.7) + F.selu(x) + F.celu(x, 1.3),
    "softplus_mish": lambda x: F.softplus(x, beta=2.0, threshold=1.0) + F.mish(x),
    "classes": lambda x: torch.isnan(torch.log(x)) ^ torch.isinf(1 / (x * (x > 0.5))),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_against_pytorch(name):
    compiled_matches_eager(ELEMENTWISE[name], rand(3, 17), rtol=1e-4, atol=1e-5)


def test_expm1_and_log1p_keep_their_precision_near_zero():
    x = torch.tensor([[1e-7, -3e-6, 2e-4, -0.5, 3.0, 100.0, -100.0, 0.0]])
    model = compiled_matches_eager(lambda t: (torch.expm1(t), torch.log1p(t.abs())), x, rtol=1e-6, atol=0)
    assert any(s.kind == "kernel" for s in model.steps)  # the te lowering, not numpy


def test_inverse_trig_at_the_edges_of_their_domain():
    x = torch.tensor([[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]])
    compiled_matches_eager(lambda t: (torch.asin(t), torch.acos(t), torch.atanh(t * 0.99),
                                      torch.acosh(t + 1.5)), x)


def test_integer_division_and_remainder_round_like_pytorch():
    a = torch.tensor([[7, -7, 7, -7, 0, 13, -13]], dtype=torch.int64)
    b = torch.tensor([[2, 2, -2, -2, 3, -5, 5]], dtype=torch.int64)
    compiled_matches_eager(lambda x, y: (torch.div(x, y, rounding_mode="floor"),
                                         torch.div(x, y, rounding_mode="trunc"),
                                         torch.remainder(x, y), torch.fmod(x, y), x // y), a, b)


def test_float_division_rounding_and_remainder():
    a, b = rand(4, 9) * 10, rand(4, 9, seed=1) + 0.1
    compiled_matches_eager(lambda x, y: (torch.div(x, y, rounding_mode="floor"),
                                         torch.div(x, y, rounding_mode="trunc"),
                                         torch.remainder(x, y), torch.fmod(x, y), torch.atan2(x, y)),
                           a, b, rtol=1e-5, atol=1e-5)


def test_bitwise_operators_on_integers():
    a = torch.tensor([[5, -3, 12, 0, 255]], dtype=torch.int32)
    b = torch.tensor([[3, 6, -1, 7, 128]], dtype=torch.int32)
    compiled_matches_eager(lambda x, y: ((x & y) | (x ^ ~y)), a, b)


def test_clamp_by_tensors_and_tensor_bounds_that_cross():
    x, lo, hi = rand(3, 8), rand(1, 8, seed=1) - 0.5, rand(3, 1, seed=2)
    compiled_matches_eager(lambda t, a, b: torch.clamp(t, min=a, max=b), x, lo, hi)


def test_reductions_with_indices_and_statistics():
    x = rand(4, 6, 5)
    x[1, 2, 3] = x[1, 4, 3]  # a tie: the first index wins, in both
    compiled_matches_eager(lambda t: (torch.max(t, dim=1), torch.min(t, 2, keepdim=True), torch.argmax(t),
                                      torch.argmin(t, dim=0), torch.amin(t, (0, 2)), torch.var(t, 1),
                                      torch.std(t, (0, 1), correction=0, keepdim=True),
                                      torch.prod(t, 2), torch.any(t > 1.5, 1), torch.cumsum(t, 1)),
                           x, rtol=1e-4, atol=1e-5)


def test_integer_sums_stay_integer():
    x = torch.arange(24, dtype=torch.int32).reshape(4, 6) - 10
    compiled_matches_eager(lambda t: (torch.cumsum(t, 1), torch.sum(t, 0), torch.prod(t[:, :3], 1)), x)


def test_sort_and_topk():
    x = rand(3, 10)
    compiled_matches_eager(lambda t: (torch.sort(t, dim=1, descending=True), torch.topk(t, 3, dim=0),
                                      torch.topk(t, 4, largest=False)), x)


def test_gathers_and_scatters():
    x = rand(4, 5)
    index = torch.tensor([[0, 3, 1], [2, 2, 0]])
    src = rand(3, 4, seed=1)
    compiled_matches_eager(lambda t, i, s: (
        torch.gather(t, 1, i), torch.scatter(t, 1, i[:, :2].flip(1).contiguous(), s),
        torch.scatter_add(t, 0, i, s), torch.scatter_reduce(t, 1, i, s, "mean"),
        torch.scatter_reduce(t, 1, i, s, "amax", include_self=False),
        torch.index_select(t, 1, i[0])), x, index, src)


def test_index_put_with_indices_and_with_a_mask():
    x = rand(4, 5)
    rows, cols = torch.tensor([0, 2, 2]), torch.tensor([1, 4, 4])
    mask = x > 0.3
    compiled_matches_eager(lambda t, r, c, m, v: (torch.index_put(t, (r, c), v, accumulate=True),
                                                  torch.index_put(t, (m,), torch.tensor(7.0)),
                                                  t.masked_scatter(m, v.repeat(7))),
                           x, rows, cols, mask, rand(3, seed=1))


def test_element_moving_operators():
    x = rand(2, 3, 4)
    compiled_matches_eager(lambda t: (torch.flip(t, (0, 2)), torch.roll(t, (1, -2), (1, 2)), t.repeat(2, 1, 1, 2),
                                      torch.diagonal(t, 1, 1, 2), torch.as_strided(t, (3, 3), (5, 2), 1),
                                      torch.select_scatter(t, t[:, 0] * 2, 1, 0),
                                      torch.slice_scatter(t, t[:, :, ::2] + 1, 2, 0, 4, 2),
                                      torch.full_like(t, 3.5)), x)


def test_convolutions_in_one_and_two_dimensions():
    x1, w1 = rand(2, 4, 11), rand(6, 2, 3, seed=1)
    x2, w2 = rand(3, 9, 8, seed=2), rand(5, 3, 4, 3, seed=3)
    compiled_matches_eager(lambda a, b, c, d: (F.conv1d(a, b, stride=2, padding=1, groups=2),
                                               F.conv2d(c, d, padding="same", dilation=(1, 2)),
                                               F.conv1d(a[0], b[:, :, :2], padding="same", groups=2)),
                           x1, w1, x2, w2, rtol=1e-4, atol=1e-5)


def test_transposed_convolutions_with_weights_given_and_as_inputs():
    x, w = rand(2, 4, 5, 6), rand(4, 3, 3, 2, seed=1)
    compiled_matches_eager(lambda a, b: (F.conv_transpose2d(a, b, stride=(2, 3), padding=(1, 0),
                                                            output_padding=(1, 2), groups=2, dilation=(1, 2)),
                                         F.conv_transpose1d(a[0, :, 0], b[:, :, 0], stride=2, padding=1)),
                           x, w, rtol=1e-4, atol=1e-5)
    layer = nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1).eval()  # a constant weight, flipped at import
    compiled_matches_eager(layer, x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample(mode, padding):
    x, grid = rand(2, 3, 5, 7), torch.rand(2, 6, 4, 2, generator=torch.Generator().manual_seed(1)) * 3 - 1.5
    for align in (False, True):
        compiled_matches_eager(lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=padding,
                                                          align_corners=align), x, grid, rtol=1e-4, atol=1e-5)


def test_pools_pads_and_resampling():
    x = rand(2, 3, 7, 6)
    compiled_matches_eager(lambda t: (F.max_pool2d(t, 3, 2, 1, return_indices=True),
                                      F.avg_pool1d(t[0], 3, 2, ceil_mode=True),
                                      F.adaptive_avg_pool1d(t[0], 2),
                                      F.pad(t, (1, 2, 2, 0), mode="reflect"),
                                      F.pad(t, (2, 1, 1, 3), mode="replicate"),
                                      F.pad(t, (1, 1, 2, 2), mode="circular"),
                                      F.pad(t, (-1, 2, 0, -2), value=0.5),
                                      F.interpolate(t, scale_factor=1.7, mode="nearest"),
                                      F.interpolate(t, size=(5, 9), mode="bilinear"),
                                      F.interpolate(t, scale_factor=2.0, mode="bilinear", align_corners=True)),
                           x, rtol=1e-4, atol=1e-5)


def test_three_dimensional_pools_as_two_dimensional_ones():
    x = rand(2, 3, 5, 6, 7)
    x[0, 1, 1, 3, 3] = x[0, 1, 2, 3, 3] = 9.0  # one box's maximum on two planes: the first wins
    compiled_matches_eager(lambda t: (F.max_pool3d(t, (2, 3, 2), (2, 1, 2), (1, 1, 0), return_indices=True),
                                      F.max_pool3d(t[0], 3, 2, ceil_mode=True, dilation=(1, 2, 1)),
                                      F.adaptive_avg_pool3d(t, (3, 4, 5))), x, rtol=1e-5, atol=1e-6)


def test_three_dimensional_convolutions_and_average_pool():
    x, w, wt = rand(2, 4, 5, 6, 4), rand(6, 2, 3, 2, 3, seed=1), rand(4, 3, 2, 3, 2, seed=2)
    compiled_matches_eager(lambda a, b, c: (F.conv3d(a, b, stride=(1, 2, 1), padding=1, groups=2),
                                            F.conv3d(a[0], b[:, :, :2], padding="same", groups=2),
                                            F.conv_transpose3d(a, c, stride=2, padding=(1, 0, 1), output_padding=1),
                                            F.avg_pool3d(a, 2, (1, 2, 2), padding=1, count_include_pad=False)),
                           x, w, wt, rtol=1e-4, atol=1e-5)


def test_max_pool_gradient_routes_to_the_maxima():
    x = rand(1, 2, 6, 6)

    def pool_grad(t):
        out, idx = torch.ops.aten.max_pool2d_with_indices(t, [2, 2], [2, 2])
        return torch.ops.aten.max_pool2d_with_indices_backward(out * 3, t, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)

    compiled_matches_eager(pool_grad, x)


def test_normalizations_and_their_statistics():
    x, w, b = rand(2, 6, 5), rand(6, seed=1), rand(6, seed=2)
    compiled_matches_eager(lambda t, g, h: (F.group_norm(t, 3, g, h, eps=1e-3),
                                            torch.native_layer_norm(t, [5], None, None, 1e-5),
                                            torch.native_group_norm(t, g, h, 2, 6, 5, 2, 1e-5)),
                           x, w, b, rtol=1e-4, atol=1e-5)


def test_empty_tensors_and_rank_zero_tensors():
    compiled_matches_eager(lambda t, s: (t[:, :0] * 2, torch.softmax(s, 0), torch.sum(s, 0), F.pad(t[:0], (1, 1))),
                           rand(3, 4), torch.tensor(1.5))


def test_refusals_name_the_operator_and_the_reason():
    with pytest.raises(UnsupportedOperatorError, match=r"aten\.nonzero.*depends on the data"):
        from_torch(Fn(torch.nonzero), (rand(3, 3),))
    stats = (torch.zeros(3), torch.ones(3))
    with pytest.raises(UnsupportedOperatorError, match=r"aten\._native_batch_norm_legit_functional.*in place"):
        from_torch(Fn(lambda t, m, v: F.batch_norm(t, m, v, training=True)), (rand(2, 3, 4),) + stats)
    with pytest.raises(UnsupportedOperatorError, match=r"aten\.topk.*sorted=False"):
        from_torch(Fn(lambda t: torch.topk(t, 2, sorted=False)), (rand(5),))
