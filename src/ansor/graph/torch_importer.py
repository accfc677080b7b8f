"""Import a PyTorch module into a model graph through `torch.export`.

`torch.export` gives a flat graph of ATen operators with static shapes. After
`run_decompositions({})` it is functional (no in-place or aliasing operators) while keeping the
high-level operators (conv2d, linear, layer_norm, scaled_dot_product_attention) whole, which is
what the canonical operator set wants: a linear stays one linear, not a transpose and a matmul.

Each ATen operator maps through a handler in `HANDLERS`. Parts of the program that do not
depend on the model inputs (position ids from `arange`, causal masks, transposed weights) are
evaluated once with PyTorch at import time and become constants, so the graph holds only the
computation that depends on the inputs. Every node's output type is derived by the canonical
operator's shape rule and checked against the type PyTorch recorded; an operator without a
handler is an `UnsupportedOperatorError` naming the operator and where it is in the model.

torch is imported inside the functions: importing `ansor.graph` must not require it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ansor.graph.ir import Graph, GraphError
from ansor.graph.ops import TensorType

if TYPE_CHECKING:
    import torch


class UnsupportedOperatorError(NotImplementedError):
    """The exported program uses an operator (or a form of one) the importer cannot map."""


@dataclass(frozen=True)
class Ref:
    """A tensor argument of an ATen call: the name of a graph value or constant."""

    name: str


Handler = Callable[["_Importer", Any, list, dict], Any]
#: ATen operator packet ("aten.conv2d", every overload) to the function that maps a call.
HANDLERS: dict[str, Handler] = {}


def _handles(*names: str):
    def deco(fn: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = fn
        return fn

    return deco


def torch_dtype_name(dtype: "torch.dtype") -> str:
    """The numpy dtype name of a torch dtype (the IR's dtypes are numpy's)."""
    name = str(dtype).removeprefix("torch.")
    try:
        return str(np.dtype(name))
    except TypeError:
        raise UnsupportedOperatorError(f"dtype {dtype} has no numpy equivalent") from None


def from_torch(module: "torch.nn.Module", example_inputs: Sequence[Any]) -> Graph:
    """Export `module` (in eval mode) on `example_inputs` and map it to a validated Graph.

    Graph inputs are the module's tensor arguments in order (named after the forward
    parameters); outputs are its tensor outputs, flattened in order."""
    import torch

    program = torch.export.export(module.eval(), tuple(example_inputs))
    program = program.run_decompositions({})
    graph = _Importer(program).run()
    graph.validate()
    return graph


def _source(node: Any) -> str:
    """Where an exported node came from: its name, module path and the model's stack line."""
    parts = [f"node {node.name!r}"]
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1]
        parts.append(f"in module {path[0] or '<root>'!r}")
    trace = node.meta.get("stack_trace")
    if trace:
        lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
        frames = [ln for ln in lines if ln.startswith("File ")]
        if frames:
            parts.append(frames[-1] + (": " + lines[-1] if lines[-1] != frames[-1] else ""))
    return ", ".join(parts)


class _Importer:
    """Walks the exported FX graph once, in order, building the Graph."""

    def __init__(self, program: Any):
        self.program = program
        self.graph = Graph()
        self.env: dict[str, Any] = {}  # fx node name -> Ref | list | python value | None
        self.node: Any = None          # the fx node being mapped (for sources and types)

    # ------------------------------------------------------------------------- driving

    def run(self) -> Graph:
        import torch

        sig = self.program.graph_signature
        state = self.program.state_dict
        constants = getattr(self.program, "constants", {})
        param_of = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
        lifted = getattr(sig, "inputs_to_lifted_tensor_constants", {})
        user_inputs = set(sig.user_inputs)
        for node in self.program.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                if node.name in param_of:
                    key = param_of[node.name]  # non-persistent buffers live in constants
                    self.env[node.name] = self._constant(state[key] if key in state
                                                         else constants[key])
                elif node.name in lifted:
                    self.env[node.name] = self._constant(constants[lifted[node.name]])
                elif node.name in user_inputs:
                    val = node.meta["val"]
                    if not isinstance(val, torch.Tensor):
                        self.env[node.name] = val
                        continue
                    self.env[node.name] = Ref(self.graph.add_input(
                        node.name, tuple(val.shape), torch_dtype_name(val.dtype)))
                else:
                    raise UnsupportedOperatorError(
                        f"unsupported exported input kind for {_source(node)}")
            elif node.op == "call_function":
                self.env[node.name] = self._call(node)
            elif node.op == "output":
                outs = node.args[0]
                for o in (outs if isinstance(outs, (list, tuple)) else [outs]):
                    ref = self.env[o.name] if hasattr(o, "name") else None
                    if not isinstance(ref, Ref):
                        raise UnsupportedOperatorError(f"output {o} is not a tensor")
                    self.graph.outputs.append(self._materialize(ref).name)
            else:
                raise UnsupportedOperatorError(f"unsupported fx node kind {node.op!r} at "
                                               f"{_source(node)}")
        self.graph.remove_dead()
        return self.graph

    def _call(self, node: Any) -> Any:
        args = self._map(node.args)
        kwargs = self._map(node.kwargs)
        target = node.target
        if target is operator.getitem:  # one output of a multi-output operator
            seq, index = args
            item = seq[index]
            if item is None:
                raise UnsupportedOperatorError(f"output {index} of a multi-output operator is "
                                               f"not supported ({_source(node)})")
            return item
        name = str(target)  # e.g. "aten.conv2d.default"
        if self._foldable(args, kwargs) and not name.startswith("aten._assert"):
            return self._fold(node, target, args, kwargs)
        handler = HANDLERS.get(name) or HANDLERS.get(name.rsplit(".", 1)[0])
        if handler is None:
            raise UnsupportedOperatorError(f"unsupported ATen operator {name} at {_source(node)}")
        try:
            result = handler(self, node, args, kwargs)
        except GraphError as e:
            raise UnsupportedOperatorError(f"cannot map {name} at {_source(node)}: {e}") from e
        if isinstance(result, Ref):
            self._check_type(result, node.meta.get("val"), name)
        return result

    def _map(self, obj: Any) -> Any:
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._map(o) for o in obj)
        if isinstance(obj, dict):
            return {k: self._map(v) for k, v in obj.items()}
        if hasattr(obj, "op") and hasattr(obj, "name") and hasattr(obj, "meta"):
            return self.env[obj.name]
        return obj

    # ------------------------------------------------------------------------- constants

    def _constant(self, tensor: "torch.Tensor") -> Ref:
        array = tensor.detach().cpu().contiguous().numpy()
        return Ref(self.graph.add_constant(array.copy()))

    def _foldable(self, args: Any, kwargs: Any) -> bool:
        """True when no argument depends on a graph input."""
        def ok(o: Any) -> bool:
            if isinstance(o, Ref):
                return self.graph.is_constant(o.name)
            if isinstance(o, (list, tuple)):
                return all(ok(x) for x in o)
            if isinstance(o, dict):
                return all(ok(x) for x in o.values())
            return True
        return ok(args) and ok(kwargs)

    def _fold(self, node: Any, target: Any, args: Any, kwargs: Any) -> Any:
        import torch

        def to_torch(o: Any) -> Any:
            if isinstance(o, Ref):
                return torch.from_numpy(self.graph.constants[o.name].copy())
            if isinstance(o, (list, tuple)):
                return type(o)(to_torch(x) for x in o)
            if isinstance(o, dict):
                return {k: to_torch(v) for k, v in o.items()}
            return o

        def from_torch_value(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return self._constant(v)
            if isinstance(v, (list, tuple)):
                return [from_torch_value(x) for x in v]
            return v

        with torch.no_grad():
            return from_torch_value(target(*to_torch(args), **to_torch(kwargs)))

    # ------------------------------------------------------------------------- helpers

    def type_of(self, ref: Ref) -> TensorType:
        return self.graph.type_of(ref.name)

    def emit(self, op: str, inputs: Sequence[Ref], **attrs: Any) -> Ref:
        """Add a canonical node for the ATen call being mapped."""
        return Ref(self.graph.add_node(op, [r.name for r in inputs], attrs,
                                       source=_source(self.node)))

    def scalar(self, value: Any, dtype: str) -> Ref:
        return Ref(self.graph.add_constant(np.asarray(value, dtype=dtype)))

    def cast(self, ref: Ref, dtype: str) -> Ref:
        if self.type_of(ref).dtype == dtype:
            return ref
        return self.emit("cast", [ref], dtype=dtype)

    def operand(self, value: Any, dtype: str) -> Ref:
        """A tensor or python scalar as a Ref of `dtype`."""
        if isinstance(value, Ref):
            return self.cast(value, dtype)
        return self.scalar(value, dtype)

    def out_type(self) -> TensorType:
        val = self.node.meta["val"]
        return TensorType(tuple(int(d) for d in val.shape), torch_dtype_name(val.dtype))

    def _materialize(self, ref: Ref) -> Ref:
        """Graph outputs must be values; a constant output is copied through a node."""
        if self.graph.is_constant(ref.name):
            t = self.type_of(ref)
            return self.emit("reshape", [ref], shape=t.shape)
        return ref

    def _check_type(self, ref: Ref, val: Any, name: str) -> None:
        import torch

        if not isinstance(val, torch.Tensor):
            return
        got = self.type_of(ref)
        want = TensorType(tuple(int(d) for d in val.shape), torch_dtype_name(val.dtype))
        if got != want:
            raise UnsupportedOperatorError(
                f"mapping {name} at {_source(self.node)} gave {got}, PyTorch gives {want}")


# ============================================================================= handlers


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))
    return (int(v), int(v))


def _arg(args: list, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


# --------------------------------------------------------------------- no-ops and casts


@_handles("aten.clone", "aten.contiguous", "aten.alias", "aten.detach", "aten.dropout",
          "aten.lift_fresh_copy", "aten.feature_dropout")
def _identity(imp: _Importer, node, args, kwargs):
    return args[0]


@_handles("aten._assert_tensor_metadata", "aten._assert_async", "aten.sym_constrain_range_for_size")
def _assertion(imp: _Importer, node, args, kwargs):
    return None


@_handles("aten._to_copy", "aten.to", "aten.type_as")
def _to(imp: _Importer, node, args, kwargs):
    x = args[0]
    return imp.cast(x, imp.out_type().dtype)


# --------------------------------------------------------------------- elementwise

_UNARY = {
    "aten.relu": "relu", "aten.relu_": "relu", "aten.sigmoid": "sigmoid", "aten.tanh": "tanh",
    "aten.exp": "exp", "aten.log": "log", "aten.sqrt": "sqrt", "aten.rsqrt": "rsqrt",
    "aten.neg": "neg", "aten.abs": "abs", "aten.erf": "erf", "aten.silu": "silu",
    "aten.silu_": "silu", "aten.hardswish": "hardswish", "aten.hardswish_": "hardswish",
    "aten.hardsigmoid": "hardsigmoid", "aten.hardsigmoid_": "hardsigmoid",
}


def _unary_handler(op: str) -> Handler:
    def handler(imp: _Importer, node, args, kwargs):
        return imp.emit(op, [imp.cast(args[0], imp.out_type().dtype)])
    return handler


for _aten, _op in _UNARY.items():
    HANDLERS[_aten] = _unary_handler(_op)


@_handles("aten.gelu", "aten.gelu_")
def _gelu(imp: _Importer, node, args, kwargs):
    return imp.emit("gelu", [args[0]], approximate=_arg(args, kwargs, 1, "approximate", "none"))


@_handles("aten.hardtanh", "aten.hardtanh_", "aten.clamp", "aten.clamp_", "aten.relu6",
          "aten.clamp_min", "aten.clamp_max")
def _clamp(imp: _Importer, node, args, kwargs):
    name = node.target.overloadpacket.__name__
    lo = hi = None
    if name.startswith("hardtanh"):
        lo, hi = _arg(args, kwargs, 1, "min_val", -1.0), _arg(args, kwargs, 2, "max_val", 1.0)
    elif name == "relu6":
        lo, hi = 0.0, 6.0
    elif name == "clamp_min":
        lo = _arg(args, kwargs, 1, "min")
    elif name == "clamp_max":
        hi = _arg(args, kwargs, 1, "max")
    else:
        lo, hi = _arg(args, kwargs, 1, "min"), _arg(args, kwargs, 2, "max")
    if isinstance(lo, Ref) or isinstance(hi, Ref):
        raise GraphError("clamp with tensor bounds is not supported")
    x = imp.cast(args[0], imp.out_type().dtype)
    return imp.emit("clamp", [x], min=None if lo is None else float(lo),
                    max=None if hi is None else float(hi))


def _binary_handler(op: str, swap: bool = False) -> Handler:
    """`a op b`, or `b op a` for the reversed ATen forms; add and sub scale the second
    operand by `alpha`."""
    def handler(imp: _Importer, node, args, kwargs):
        dtype = imp.out_type().dtype
        first, second = (args[1], args[0]) if swap else (args[0], args[1])
        first, second = imp.operand(first, dtype), imp.operand(second, dtype)
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        if op in ("add", "sub") and alpha != 1:
            second = imp.emit("mul", [second, imp.scalar(alpha, dtype)])
        return imp.emit(op, [first, second])
    return handler


for _aten, _op in {"aten.add": "add", "aten.add_": "add", "aten.sub": "sub", "aten.sub_": "sub",
                   "aten.mul": "mul", "aten.mul_": "mul", "aten.pow": "pow",
                   "aten.maximum": "maximum", "aten.minimum": "minimum"}.items():
    HANDLERS[_aten] = _binary_handler(_op)
HANDLERS["aten.rsub"] = _binary_handler("sub", swap=True)


@_handles("aten.div", "aten.div_")
def _div(imp: _Importer, node, args, kwargs):
    mode = kwargs.get("rounding_mode", args[2] if len(args) > 2 else None)
    if mode is not None:
        raise GraphError(f"div with rounding_mode={mode!r} is not supported")
    dtype = imp.out_type().dtype
    return imp.emit("div", [imp.operand(args[0], dtype), imp.operand(args[1], dtype)])


def _common_dtype(imp: _Importer, a: Any, b: Any) -> str:
    """PyTorch's promotion for a comparison: tensors decide, python scalars only lift ints."""
    types = [imp.type_of(x).dtype for x in (a, b) if isinstance(x, Ref)]
    dtype = str(np.result_type(*types)) if types else "float32"
    if any(isinstance(x, float) for x in (a, b)) and not dtype.startswith("float"):
        dtype = "float32"
    return dtype


def _compare_handler(op: str) -> Handler:
    def handler(imp: _Importer, node, args, kwargs):
        dtype = _common_dtype(imp, args[0], args[1])
        return imp.emit(op, [imp.operand(args[0], dtype), imp.operand(args[1], dtype)])
    return handler


for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    HANDLERS[f"aten.{_op}"] = _compare_handler(_op)


def _logical_handler(op: str) -> Handler:
    def handler(imp: _Importer, node, args, kwargs):
        if imp.out_type().dtype != "bool":
            raise GraphError(f"{op} on {imp.out_type().dtype} (bitwise) is not supported")
        arity = 1 if op == "logical_not" else 2
        return imp.emit(op, [imp.operand(a, "bool") for a in args[:arity]])
    return handler


for _aten, _op in {"aten.__and__": "logical_and", "aten.bitwise_and": "logical_and",
                   "aten.logical_and": "logical_and", "aten.__or__": "logical_or",
                   "aten.bitwise_or": "logical_or", "aten.logical_or": "logical_or",
                   "aten.bitwise_not": "logical_not", "aten.logical_not": "logical_not"}.items():
    HANDLERS[_aten] = _logical_handler(_op)


@_handles("aten.where")
def _where(imp: _Importer, node, args, kwargs):
    if len(args) != 3:
        raise GraphError("where with one argument (nonzero) is not supported")
    dtype = imp.out_type().dtype
    return imp.emit("where", [imp.cast(args[0], "bool"), imp.operand(args[1], dtype),
                              imp.operand(args[2], dtype)])


@_handles("aten.masked_fill", "aten.masked_fill_")
def _masked_fill(imp: _Importer, node, args, kwargs):
    x, mask, value = args[0], args[1], args[2]
    dtype = imp.out_type().dtype
    return imp.emit("where", [imp.cast(mask, "bool"), imp.operand(value, dtype), x])


# --------------------------------------------------------------------- reductions


def _dims(dims: Any, rank: int) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return tuple(sorted(int(d) % rank for d in dims))


def _reduce_handler(op: str) -> Handler:
    def handler(imp: _Importer, node, args, kwargs):
        x = args[0]
        rank = len(imp.type_of(x).shape)
        dims = _dims(_arg(args, kwargs, 1, "dim"), rank)
        keep = bool(_arg(args, kwargs, 2, "keepdim", False))
        if op != "max":
            x = imp.cast(x, imp.out_type().dtype)
        return imp.emit(op, [x], axes=dims, keepdims=keep)
    return handler


HANDLERS["aten.mean"] = _reduce_handler("mean")
HANDLERS["aten.sum"] = _reduce_handler("sum")
HANDLERS["aten.amax"] = _reduce_handler("max")


@_handles("aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax")
def _softmax(imp: _Importer, node, args, kwargs):
    op = "log_softmax" if "log" in node.target.overloadpacket.__name__ else "softmax"
    x = imp.cast(args[0], imp.out_type().dtype)
    return imp.emit(op, [x], axis=int(args[1]) % len(imp.type_of(x).shape))


@_handles("aten.layer_norm")
def _layer_norm(imp: _Importer, node, args, kwargs):
    x, shape = args[0], args[1]
    w, b = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")
    eps = float(_arg(args, kwargs, 4, "eps", 1e-5))
    inputs = [x]
    if w is not None or b is not None:
        inputs.append(w if w is not None else imp.scalar(np.ones(shape), "float32"))
    if b is not None:
        inputs.append(b)
    return imp.emit("layer_norm", inputs, normalized_ndim=len(shape), eps=eps)


@_handles("aten.native_layer_norm")
def _native_layer_norm(imp: _Importer, node, args, kwargs):
    return [_layer_norm(imp, node, list(args), kwargs), None, None]


def _bn(imp: _Importer, x, w, b, mean, var, eps) -> Ref:
    c = imp.type_of(x).shape[1]
    dtype = imp.type_of(x).dtype
    w = w if w is not None else imp.scalar(np.ones(c), dtype)
    b = b if b is not None else imp.scalar(np.zeros(c), dtype)
    return imp.emit("batch_norm", [x, mean, var, w, b], eps=float(eps))


@_handles("aten._native_batch_norm_legit_no_training")
def _bn_no_training(imp: _Importer, node, args, kwargs):
    x, w, b, mean, var, _momentum, eps = args
    return [_bn(imp, x, w, b, mean, var, eps), None, None]


@_handles("aten.batch_norm")
def _batch_norm(imp: _Importer, node, args, kwargs):
    x, w, b, mean, var, training, _momentum, eps = args[:8]
    if training or mean is None:
        raise GraphError("batch norm in training mode (batch statistics) is not supported")
    return _bn(imp, x, w, b, mean, var, eps)


# --------------------------------------------------------------------- dense


@_handles("aten.conv2d", "aten.convolution")
def _conv2d(imp: _Importer, node, args, kwargs):
    if node.target.overloadpacket.__name__ == "convolution":
        x, w, b, stride, padding, dilation, transposed, _out_pad, groups = args
        if transposed:
            raise GraphError("transposed convolution is not supported")
    else:
        x, w = args[0], args[1]
        b = _arg(args, kwargs, 2, "bias")
        stride = _arg(args, kwargs, 3, "stride", 1)
        padding = _arg(args, kwargs, 4, "padding", 0)
        dilation = _arg(args, kwargs, 5, "dilation", 1)
        groups = _arg(args, kwargs, 6, "groups", 1)
    if len(imp.type_of(w).shape) != 4:
        raise GraphError(f"only 2-d convolution is supported (weight {imp.type_of(w).shape})")
    dilation = _pair(dilation)
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0, 0)
        else:  # "same": symmetric only when the total is even
            k = imp.type_of(w).shape[2:]
            totals = [d * (kk - 1) for d, kk in zip(dilation, k)]
            if any(t % 2 for t in totals):
                raise GraphError("padding='same' with asymmetric padding is not supported")
            padding = tuple(t // 2 for t in totals)
    inputs = [x, w] + ([b] if b is not None else [])
    return imp.emit("conv2d", inputs, stride=_pair(stride), padding=_pair(padding),
                    dilation=dilation, groups=int(groups))


@_handles("aten.linear")
def _linear(imp: _Importer, node, args, kwargs):
    b = _arg(args, kwargs, 2, "bias")
    return imp.emit("linear", [args[0], args[1]] + ([b] if b is not None else []))


@_handles("aten.mm", "aten.bmm", "aten.matmul")
def _matmul(imp: _Importer, node, args, kwargs):
    a, b = args[0], args[1]
    ta, tb = imp.type_of(a), imp.type_of(b)
    if len(ta.shape) >= 2 and len(tb.shape) >= 2:
        return imp.emit("matmul", [a, b])
    # Vector operands: lift to matrices, multiply, then drop the lifted axis.
    a2 = imp.emit("reshape", [a], shape=(1,) + ta.shape) if len(ta.shape) == 1 else a
    b2 = imp.emit("reshape", [b], shape=tb.shape + (1,)) if len(tb.shape) == 1 else b
    return imp.emit("reshape", [imp.emit("matmul", [a2, b2])], shape=imp.out_type().shape)


@_handles("aten.addmm")
def _addmm(imp: _Importer, node, args, kwargs):
    bias, a, b = args[0], args[1], args[2]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    dtype = imp.out_type().dtype
    y = imp.emit("matmul", [a, b])
    if alpha != 1:
        y = imp.emit("mul", [y, imp.scalar(alpha, dtype)])
    if beta == 0:
        return y
    if beta != 1:
        bias = imp.emit("mul", [bias, imp.scalar(beta, dtype)])
    return imp.emit("add", [y, bias])


@_handles("aten.scaled_dot_product_attention")
def _sdpa(imp: _Importer, node, args, kwargs):
    q, k, v = args[:3]
    mask = _arg(args, kwargs, 3, "attn_mask")
    dropout = _arg(args, kwargs, 4, "dropout_p", 0.0)
    causal = bool(_arg(args, kwargs, 5, "is_causal", False))
    scale = _arg(args, kwargs, 6, "scale")
    if _arg(args, kwargs, 7, "enable_gqa", False):
        raise GraphError("grouped-query attention (enable_gqa) is not supported")
    if dropout:
        raise GraphError("attention dropout is not supported in inference graphs")
    inputs = [q, k, v]
    if mask is not None:
        mask_t = imp.type_of(mask)
        inputs.append(mask if mask_t.dtype == "bool" else imp.cast(mask, imp.type_of(q).dtype))
    return imp.emit("scaled_dot_product_attention", inputs, is_causal=causal,
                    scale=None if scale is None else float(scale))


@_handles("aten.embedding")
def _embedding(imp: _Importer, node, args, kwargs):
    # torch.embedding refuses negative ids (indexing with a tensor, aten.index, takes them)
    return imp.emit("embedding", [args[0], args[1]], negative_ids=False)


@_handles("aten.index")
def _index(imp: _Importer, node, args, kwargs):
    x, indices = args[0], list(args[1])
    while indices and indices[-1] is None:
        indices.pop()
    if any(i is None for i in indices):
        raise GraphError("indexing that skips an axis is not supported")
    if any(imp.type_of(i).dtype == "bool" for i in indices):
        raise GraphError("boolean mask indexing (data-dependent shape) is not supported")
    return imp.emit("index", [x] + [imp.cast(i, "int64") for i in indices])


# --------------------------------------------------------------------- pooling


@_handles("aten.max_pool2d", "aten.max_pool2d_with_indices")
def _max_pool2d(imp: _Importer, node, args, kwargs):
    x, kernel = args[0], _pair(args[1])
    stride = _arg(args, kwargs, 2, "stride", None)
    stride = kernel if not stride else _pair(stride)
    out = imp.emit("max_pool2d", [x], kernel=kernel, stride=stride,
                   padding=_pair(_arg(args, kwargs, 3, "padding", 0)),
                   dilation=_pair(_arg(args, kwargs, 4, "dilation", 1)),
                   ceil_mode=bool(_arg(args, kwargs, 5, "ceil_mode", False)))
    return out if "indices" not in str(node.target) else [out, None]


@_handles("aten.avg_pool2d")
def _avg_pool2d(imp: _Importer, node, args, kwargs):
    x, kernel = args[0], _pair(args[1])
    stride = _arg(args, kwargs, 2, "stride", None)
    stride = kernel if not stride else _pair(stride)
    div = _arg(args, kwargs, 6, "divisor_override")
    return imp.emit("avg_pool2d", [x], kernel=kernel, stride=stride,
                    padding=_pair(_arg(args, kwargs, 3, "padding", 0)),
                    ceil_mode=bool(_arg(args, kwargs, 4, "ceil_mode", False)),
                    count_include_pad=bool(_arg(args, kwargs, 5, "count_include_pad", True)),
                    divisor_override=None if div is None else int(div))


@_handles("aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool2d")
def _adaptive_avg_pool2d(imp: _Importer, node, args, kwargs):
    x = args[0]
    size = list(_pair(args[1]) if not isinstance(args[1], (list, tuple)) else args[1])
    shape = imp.type_of(x).shape
    if len(shape) != 4:
        raise GraphError("adaptive_avg_pool2d needs NCHW input")
    size = tuple(shape[2 + i] if s is None else int(s) for i, s in enumerate(size))
    return imp.emit("adaptive_avg_pool2d", [x], output_size=size)


# --------------------------------------------------------------------- layout


@_handles("aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten", "aten.unflatten",
          "aten.squeeze", "aten.unsqueeze", "aten.view_as", "aten.reshape_as")
def _reshape(imp: _Importer, node, args, kwargs):
    """Every shape-only change becomes a reshape to the shape PyTorch computed."""
    shape = imp.out_type().shape
    if imp.type_of(args[0]).shape == shape:
        return args[0]
    return imp.emit("reshape", [args[0]], shape=shape)


@_handles("aten.permute")
def _permute(imp: _Importer, node, args, kwargs):
    rank = len(imp.type_of(args[0]).shape)
    return imp.emit("permute", [args[0]], axes=tuple(int(d) % rank for d in args[1]))


@_handles("aten.transpose", "aten.t", "aten.swapaxes")
def _transpose(imp: _Importer, node, args, kwargs):
    rank = len(imp.type_of(args[0]).shape)
    if rank < 2:
        return args[0]
    d0, d1 = (int(args[1]) % rank, int(args[2]) % rank) if len(args) > 1 else (0, 1)
    axes = list(range(rank))
    axes[d0], axes[d1] = axes[d1], axes[d0]
    return imp.emit("permute", [args[0]], axes=tuple(axes))


@_handles("aten.expand", "aten.expand_as", "aten.broadcast_to")
def _expand(imp: _Importer, node, args, kwargs):
    x, shape = args[0], imp.out_type().shape
    if len(imp.type_of(x).shape) < len(shape):  # expand adds leading axes
        pad = (1,) * (len(shape) - len(imp.type_of(x).shape))
        x = imp.emit("reshape", [x], shape=pad + imp.type_of(x).shape)
    if imp.type_of(x).shape == shape:
        return x
    return imp.emit("expand", [x], shape=shape)


@_handles("aten.cat", "aten.concat")
def _cat(imp: _Importer, node, args, kwargs):
    tensors = [t for t in args[0] if imp.type_of(t).shape != (0,)]  # legacy empty inputs
    rank = len(imp.out_type().shape)
    axis = int(_arg(args, kwargs, 1, "dim", 0)) % rank
    tensors = [t for t in tensors if imp.type_of(t).shape[axis] != 0] or tensors[:1]
    if len(tensors) == 1:
        return tensors[0]
    dtype = imp.out_type().dtype
    return imp.emit("concat", [imp.cast(t, dtype) for t in tensors], axis=axis)


def _slice_ref(imp: _Importer, x: Ref, axis: int, start: Any, end: Any, step: int) -> Ref:
    size = imp.type_of(x).shape[axis]
    start, end, _ = slice(start, end, step).indices(size)
    end = max(end, start)
    if (start, end, step) == (0, size, 1):
        return x
    return imp.emit("slice", [x], axis=axis, start=start, end=end, step=step)


@_handles("aten.slice")
def _slice(imp: _Importer, node, args, kwargs):
    x = args[0]
    rank = len(imp.type_of(x).shape)
    axis = int(_arg(args, kwargs, 1, "dim", 0)) % rank
    return _slice_ref(imp, x, axis, _arg(args, kwargs, 2, "start"), _arg(args, kwargs, 3, "end"),
                      int(_arg(args, kwargs, 4, "step", 1)))


@_handles("aten.select")
def _select(imp: _Importer, node, args, kwargs):
    x, dim, index = args[0], int(args[1]), int(args[2])
    shape = imp.type_of(x).shape
    axis = dim % len(shape)
    index %= shape[axis]
    sliced = _slice_ref(imp, x, axis, index, index + 1, 1)
    return imp.emit("reshape", [sliced], shape=imp.out_type().shape)


@_handles("aten.split", "aten.split_with_sizes", "aten.chunk", "aten.unbind")
def _split(imp: _Importer, node, args, kwargs):
    x = args[0]
    shape = imp.type_of(x).shape
    name = node.target.overloadpacket.__name__
    outs = node.meta["val"]
    dim = int(_arg(args, kwargs, 2 if name != "unbind" else 1, "dim", 0)) % len(shape)
    pieces, start = [], 0
    for val in outs:
        n = 1 if name == "unbind" else int(val.shape[dim])
        piece = _slice_ref(imp, x, dim, start, start + n, 1)
        if name == "unbind":
            piece = imp.emit("reshape", [piece], shape=tuple(int(d) for d in val.shape))
        pieces.append(piece)
        start += n
    return pieces


@_handles("aten.pad", "aten.constant_pad_nd")
def _pad(imp: _Importer, node, args, kwargs):
    x, pad = args[0], list(args[1])
    if node.target.overloadpacket.__name__ == "pad":
        mode = _arg(args, kwargs, 2, "mode", "constant")
        if mode != "constant":
            raise GraphError(f"pad mode {mode!r} is not supported")
        value = _arg(args, kwargs, 3, "value", None)
    else:
        value = _arg(args, kwargs, 2, "value", 0)
    rank = len(imp.type_of(x).shape)
    pairs = [(0, 0)] * rank
    for i in range(len(pad) // 2):  # PyTorch lists the last axis first
        pairs[rank - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if any(lo < 0 or hi < 0 for lo, hi in pairs):
        raise GraphError("negative padding (cropping) is not supported")
    return imp.emit("pad", [x], pads=tuple(pairs), value=float(value or 0.0))
