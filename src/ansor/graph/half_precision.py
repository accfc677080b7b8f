"""What an operator on bfloat16 values computes: PyTorch's rule on the CPU.

A model converted with `model.to(torch.bfloat16)` stores its weights and activations in 16
bits, but PyTorch's CPU kernels compute each operator in float32 and round its result to the
storage type once: a matmul or convolution accumulates its products in float32, softmax and
layer norm take their maximum, sums and variance in float32, gelu or silu are evaluated in
float32 as a whole. Rounding after every arithmetic step instead (as te's own half-precision
arithmetic does for one operation) would drift from PyTorch by several bf16 units within one
layer norm. So a graph node whose operands or result are half floats is *widened*: its half
operands are read as float32, the node computes in float32, and its half result is rounded to
nearest even, once. Both executors follow it: the numpy reference (`reference.run_node`) and
the te lowering (`to_te.lower_subgraph`), where the widening reads stay inline in the
consumer's expression, so a linear's weight stays bfloat16 in memory and its products are the
`cast(x) * cast(w)` summed in float32 that the dot-product rule (vdpbf16ps) matches.

Operators that only move, select or convert values (layout ops, gathers, max/min reductions,
max pooling, casts) are exact in the storage type and are left as they are.
"""

from __future__ import annotations

from ansor import te
from ansor.graph.ir import Graph, Node
from ansor.graph.ops import TensorType
from ansor.te import expr as E
from ansor.te.tensor import Tensor

#: the storage types whose operators compute in float32. float16 graphs keep their per-operation
#: rounding (ONNX's reference outputs for float16 are computed that way), except in `SUMMING_OPS`
HALF_FLOAT_DTYPES = frozenset(("bfloat16",))
#: the types a widened node reads as float32 and rounds its result back to
WIDENED_DTYPES = frozenset(("bfloat16", "float16"))
COMPUTE_DTYPE = "float32"

#: operators that sum many values: in float16 they too accumulate in float32 and round once, as
#: PyTorch, cuDNN and numpy (its float16 dot product and mean) compute them; a float16 running
#: sum loses a unit in the last place every few hundred terms, and te refuses one. Softmax and
#: layer norm keep their per-operation rounding in float16 (ONNX's reference outputs for them
#: are computed so), and a float16 graph's kernels run them on the reference executor
SUMMING_OPS = frozenset({
    "conv2d", "winograd_input", "winograd_output", "linear", "matmul", "mean",
    "avg_pool2d", "adaptive_avg_pool2d",
})

#: operators whose result is one of their operands' values (or a conversion, `cast`): exact in
#: any type, so widening them would only spend bandwidth
EXACT_OPS = frozenset({
    "cast", "reshape", "permute", "expand", "slice", "concat", "pad", "embedding", "take",
    "index", "max", "min", "max_pool2d", "where", "relu", "neg", "abs", "maximum", "minimum",
    "clamp",
})


#: operators written whole by a template that reads its operands in their own type: a widened
#: node of these has no te form yet, and the reference kernels run it (in float32, rounded once)
NO_WIDENED_FORM = frozenset({"attention"})


def widened(node: Node, graph: Graph) -> bool:
    """Whether `node` of `graph` computes in float32 on half-float operands (module docstring)."""
    if node.op in EXACT_OPS:
        return False
    dtypes = WIDENED_DTYPES if node.op in SUMMING_OPS else HALF_FLOAT_DTYPES
    return any(graph.type_of(name).dtype in dtypes for name in (*node.inputs, node.output))


def compute_type(t: TensorType) -> TensorType:
    """The type a widened node computes `t` in: float32 for a half float, else `t`."""
    return TensorType(t.shape, COMPUTE_DTYPE) if t.dtype in WIDENED_DTYPES else t


class Float32View(Tensor):
    """A bfloat16 tensor read as float32: each read is `cast(t[i], "float32")`, inline in the
    reader's expression, so no float32 copy is made and the reads still name the bfloat16
    tensor (a weight stays a bfloat16 placeholder, packable, matched by dot-product rules)."""

    def __init__(self, tensor: Tensor):
        super().__init__(tensor.op)
        self.stored = tensor

    @property
    def dtype(self) -> str:
        return COMPUTE_DTYPE

    def __getitem__(self, indices) -> E.Expr:
        return E.cast(self.stored[indices], COMPUTE_DTYPE)

    def __repr__(self) -> str:
        return f"Float32View({self.stored!r})"


def widen_value(value: Tensor | E.Expr) -> Tensor | E.Expr:
    """A te operand of a widened node as float32 (a tensor as a `Float32View`, a literal cast)."""
    if value.dtype not in WIDENED_DTYPES:
        return value
    return Float32View(value) if isinstance(value, Tensor) else E.cast(value, COMPUTE_DTYPE)


def rounded(result: Tensor, dtype: str, name: str) -> Tensor:
    """The float32 `result` of a widened node rounded to its half-float type, once."""
    if result.dtype == dtype:
        return result
    return te.compute(result.shape, lambda *i: E.cast(result[i], dtype), name=f"{name}_round",
                      tag="elemwise")
