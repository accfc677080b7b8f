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
from ansor.torch_arrays import numpy_to_tensor, tensor_to_numpy

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


def from_torch(module: "torch.nn.Module", example_inputs: Sequence[Any], dynamic_shapes: Any = None,
               buckets: dict[str, Sequence[int]] | None = None) -> Graph:
    """Export `module` (in eval mode) on `example_inputs` and map it to a validated Graph.

    Graph inputs are the module's tensor arguments in order (named after the forward
    parameters); outputs are its tensor outputs, flattened in order. With `dynamic_shapes`
    (torch.export's form, `Dim`s with a declared max) the result is a `graph.dynamic.DynamicGraph`
    served by buckets (`buckets` {dim name: sizes} overrides the default powers of two)."""
    import torch

    if dynamic_shapes is not None:
        from ansor.graph.dynamic import from_torch_dynamic

        return from_torch_dynamic(module, example_inputs, dynamic_shapes, buckets)

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
                outs = outs if isinstance(outs, (list, tuple)) else [outs]
                outs = self._user_outputs(outs)
                for o in outs:
                    ref = self.env[o.name] if hasattr(o, "name") else None
                    if not isinstance(ref, Ref):
                        raise UnsupportedOperatorError(f"output {o} is not a tensor")
                    self.graph.outputs.append(self._materialize(ref).name)
            else:
                raise UnsupportedOperatorError(f"unsupported fx node kind {node.op!r} at "
                                               f"{_source(node)}")
        self.graph.remove_dead()
        return self.graph

    def _user_outputs(self, outs: Sequence[Any]) -> list:
        """The program's own outputs. A program that writes to one of its inputs or buffers
        (a training-mode batch norm updating its running statistics) is refused: a compiled
        model returns values and changes nothing else."""
        from torch.export.graph_signature import OutputKind

        specs = self.program.graph_signature.output_specs
        if len(specs) != len(outs):
            return list(outs)
        for spec, o in zip(specs, outs):
            if spec.kind in (OutputKind.USER_INPUT_MUTATION, OutputKind.BUFFER_MUTATION,
                             OutputKind.PARAMETER_MUTATION):
                while getattr(o, "target", None) is operator.getitem:
                    o = o.args[0]  # the operator of which this is one output
                producer = getattr(o, "target", None)
                raise UnsupportedOperatorError(
                    f"{producer} writes to {spec.target!r} in place ({spec.kind.name.lower()}); "
                    f"a compiled model does not change its inputs or buffers")
        return [o for spec, o in zip(specs, outs) if spec.kind == OutputKind.USER_OUTPUT]

    def _call(self, node: Any) -> Any:
        args = self._map(node.args)
        kwargs = self._map(node.kwargs)
        target = node.target
        if target is operator.getitem:  # one output of a multi-output operator
            seq, index = args
            item = seq[index]
            if item is None:
                producer = node.args[0]
                raise UnsupportedOperatorError(
                    f"output {index} of {getattr(producer, 'target', 'a multi-output operator')} "
                    f"is not supported ({_source(node)})")
            if isinstance(item, Ref):
                self._check_type(item, node.meta.get("val"), f"output {index} of {node.args[0].target}")
            return item
        name = str(target)  # e.g. "aten.conv2d.default"
        if self._foldable(args, kwargs) and not name.startswith("aten._assert"):
            return self._fold(node, target, args, kwargs)
        handler = HANDLERS.get(name) or HANDLERS.get(name.rsplit(".", 1)[0])
        if handler is None:
            raise UnsupportedOperatorError(f"unsupported ATen operator {name} at {_source(node)}")
        self._check_static(node, name, args, kwargs)
        empty = self._empty_result(node)
        if empty is not None:
            return empty
        try:
            result = handler(self, node, args, kwargs)
        except GraphError as e:
            raise UnsupportedOperatorError(f"cannot map {name} at {_source(node)}: {e}") from e
        if isinstance(result, Ref):
            self._check_type(result, node.meta.get("val"), name)
        return result

    def _empty_result(self, node: Any) -> Ref | None:
        """A result without elements is known from its type alone: a constant."""
        import torch

        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.numel() == 0:
            return Ref(self.graph.add_constant(np.empty(tuple(val.shape),
                                                        dtype=torch_dtype_name(val.dtype))))
        return None

    def _check_static(self, node: Any, name: str, args: Any, kwargs: Any) -> None:
        """Refuse, naming the operator, what the graph cannot hold: outputs whose shape depends
        on the data (symbolic sizes)."""
        import torch

        vals = node.meta.get("val")
        for v in vals if isinstance(vals, (list, tuple)) else [vals]:
            if isinstance(v, torch.Tensor):
                if not all(isinstance(d, int) for d in v.shape):
                    raise UnsupportedOperatorError(
                        f"{name} at {_source(node)}: an output whose shape depends on the data "
                        f"({tuple(v.shape)}) is not supported")
        if name.startswith(("aten.cat.", "aten.concat.")):
            return  # concatenation leaves empty inputs out

        def refs(o: Any) -> list:
            if isinstance(o, Ref):
                return [o]
            if isinstance(o, (list, tuple)):
                return [r for x in o for r in refs(x)]
            if isinstance(o, dict):
                return [r for x in o.values() for r in refs(x)]
            return []

        empty = [r for r in refs(args) + refs(kwargs) if 0 in self.type_of(r).shape]
        val = vals if not isinstance(vals, (list, tuple)) else None
        if empty and not (isinstance(val, torch.Tensor) and val.numel() == 0):
            raise UnsupportedOperatorError(
                f"{name} at {_source(node)}: a non-empty result of an empty tensor (shape "
                f"{self.type_of(empty[0]).shape}) is not supported")

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
        array = tensor_to_numpy(tensor.detach().cpu().contiguous())
        return Ref(self.graph.add_constant(array.copy()))

    def _foldable(self, args: Any, kwargs: Any) -> bool:
        """True when no argument depends on a graph input (a tensor without elements holds
        nothing that could)."""
        def ok(o: Any) -> bool:
            if isinstance(o, Ref):
                return self.graph.is_constant(o.name) or 0 in self.type_of(o).shape
            if isinstance(o, (list, tuple)):
                return all(ok(x) for x in o)
            if isinstance(o, dict):
                return all(ok(x) for x in o.values())
            return True
        return ok(args) and ok(kwargs)

    def _fold(self, node: Any, target: Any, args: Any, kwargs: Any) -> Any:
        import torch

        def to_torch(o: Any) -> Any:
            if isinstance(o, Ref) and not self.graph.is_constant(o.name):  # an empty input
                t = self.type_of(o)
                return numpy_to_tensor(np.empty(t.shape, dtype=t.dtype))
            if isinstance(o, Ref):
                return numpy_to_tensor(self.graph.constants[o.name].copy())
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
    """Reduced axes, sorted and non-negative: all of them for None or []; a rank-0 tensor
    takes dim 0 or -1 (PyTorch's rule) and has no axis to reduce."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    if rank == 0:
        if any(int(d) not in (0, -1) for d in dims):
            raise GraphError(f"dim {list(dims)} out of range for a rank-0 tensor")
        return ()
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
    if not imp.type_of(x).shape:  # a rank-0 tensor is a softmax over one element
        return _reshape_to(imp, imp.emit(op, [_reshape_to(imp, x, (1,))], axis=0), ())
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


@_handles("aten.conv2d", "aten.convolution", "aten.conv1d")  # conv3d: below
def _conv2d(imp: _Importer, node, args, kwargs):
    """1-d and 2-d convolutions, batched or not: a 1-d one is a 2-d one of height 1, an
    unbatched input a batch of one; padding="same" pads (total // 2, the rest), as PyTorch."""
    if node.target.overloadpacket.__name__ == "convolution":
        x, w, b, stride, padding, dilation, transposed, out_pad, groups = args
        if transposed:
            return _conv_transpose(imp, x, w, b, stride, padding, out_pad, groups, dilation)
        if len(imp.type_of(w).shape) == 5:
            return _conv3d(imp, x, w, b, stride, padding, dilation, groups)
    else:
        x, w = args[0], args[1]
        b = _arg(args, kwargs, 2, "bias")
        stride = _arg(args, kwargs, 3, "stride", 1)
        padding = _arg(args, kwargs, 4, "padding", 0)
        dilation = _arg(args, kwargs, 5, "dilation", 1)
        groups = _arg(args, kwargs, 6, "groups", 1)
    wshape = imp.type_of(w).shape
    if len(wshape) not in (3, 4):
        raise GraphError(f"only 1-d and 2-d convolutions are supported (weight {wshape})")
    one_d = len(wshape) == 3

    def pair(v: Any) -> tuple[int, int]:
        if one_d:
            v = v[0] if isinstance(v, (list, tuple)) else v
            return (1, int(v)) if v is not None else (1, 1)
        return _pair(v)

    stride, dilation = pair(stride), pair(dilation)
    xshape = imp.type_of(x).shape
    batched = len(xshape) == len(wshape)
    if not batched and len(xshape) != len(wshape) - 1:
        raise GraphError(f"input {xshape} for weight {wshape}")
    x4 = _reshape_to(imp, x, ((1,) if not batched else ()) + xshape[:-1 if one_d else len(xshape)]
                     + ((1, xshape[-1]) if one_d else ()))
    w4 = _reshape_to(imp, w, wshape[:2] + (1, wshape[2]) if one_d else wshape)
    k = imp.type_of(w4).shape[2:]
    if isinstance(padding, str):
        if padding == "valid":
            pads: tuple = (0, 0)
        else:  # "same": the total split as PyTorch does, the extra cell at the end
            totals = [d * (kk - 1) for d, kk in zip(dilation, k)]
            pads = (totals[0] // 2, totals[1] // 2, totals[0] - totals[0] // 2,
                    totals[1] - totals[1] // 2)
            if pads[:2] == pads[2:]:
                pads = pads[:2]
    else:
        pads = pair(padding) if one_d else _pair(padding)
        if one_d:
            pads = (0, pads[1])
    inputs = [x4, w4] + ([b] if b is not None else [])
    y = imp.emit("conv2d", inputs, stride=stride, padding=tuple(pads), dilation=dilation,
                 groups=int(groups))
    return _reshape_to(imp, y, _out_shape(imp))


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


@_handles("aten._int_mm")
def _int_mm(imp: _Importer, node, args, kwargs):
    """int8 x int8 -> int32 (`torch._int_mm`): the integer matmul, exact in int32."""
    from ansor.graph import quantized_ops  # noqa: F401  (registers matmul_integer)

    return imp.emit("matmul_integer", [args[0], args[1]])


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
    attrs = dict(kernel=kernel, stride=stride, padding=_pair(_arg(args, kwargs, 3, "padding", 0)),
                 dilation=_pair(_arg(args, kwargs, 4, "dilation", 1)),
                 ceil_mode=bool(_arg(args, kwargs, 5, "ceil_mode", False)))
    out = imp.emit("max_pool2d", [x], **attrs)
    if "indices" not in str(node.target):
        return out
    return [out, imp.emit("max_pool2d_indices", [x], **attrs)]


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
    if end == start:  # no element: known from the type alone
        t = imp.type_of(x)
        return Ref(imp.graph.add_constant(np.empty(t.shape[:axis] + (0,) + t.shape[axis + 1:], t.dtype)))
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


# ============================================================================= core ATen set
# The operators of PyTorch's core ATen set (`torch_conformance` measures them on PyTorch's own
# samples), mapped onto the canonical operators or composed of them where the composition
# computes what PyTorch computes; what neither can do exactly is refused by name.


def _out_shape(imp: _Importer) -> tuple[int, ...]:
    return imp.out_type().shape


def _reshape_to(imp: _Importer, x: Ref, shape: Sequence[int]) -> Ref:
    shape = tuple(int(d) for d in shape)
    return x if imp.type_of(x).shape == shape else imp.emit("reshape", [x], shape=shape)


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint")) or dtype == "bool"


for _aten, _op in {"aten.sin": "sin", "aten.cos": "cos", "aten.tan": "tan", "aten.asin": "asin",
                   "aten.acos": "acos", "aten.atan": "atan", "aten.sinh": "sinh",
                   "aten.cosh": "cosh", "aten.asinh": "asinh", "aten.acosh": "acosh",
                   "aten.atanh": "atanh", "aten.expm1": "expm1", "aten.log1p": "log1p"}.items():
    HANDLERS[_aten] = _unary_handler(_op)


@_handles("aten.floor", "aten.ceil", "aten.round", "aten.trunc", "aten.fix")
def _rounding(imp: _Importer, node, args, kwargs):
    """Rounding is the identity on integers; trunc is floor above zero and ceil below."""
    x, name = args[0], node.target.overloadpacket.__name__
    if _is_int(imp.type_of(x).dtype):
        return x
    decimals = int(kwargs.get("decimals", args[1] if len(args) > 1 else 0))
    if name in ("trunc", "fix"):
        zero = imp.scalar(0, imp.type_of(x).dtype)
        return imp.emit("where", [imp.emit("lt", [x, zero]), imp.emit("ceil", [x]),
                                  imp.emit("floor", [x])])
    if decimals == 0:
        return imp.emit(name, [x])
    # PyTorch: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d, in x's dtype
    dtype = imp.type_of(x).dtype
    scale = imp.scalar(10.0 ** abs(decimals), dtype)
    inner, outer = ("mul", "div") if decimals > 0 else ("div", "mul")
    return imp.emit(outer, [imp.emit("round", [imp.emit(inner, [x, scale])]), scale])


@_handles("aten.sign")
def _sign(imp: _Importer, node, args, kwargs):
    x = args[0]
    if imp.type_of(x).dtype == "bool":
        return x
    return imp.emit("sign", [x])


@_handles("aten.reciprocal")
def _reciprocal(imp: _Importer, node, args, kwargs):
    dtype = imp.out_type().dtype
    return imp.emit("div", [imp.scalar(1, dtype), imp.cast(args[0], dtype)])


@_handles("aten.log2", "aten.log10")
def _log_base(imp: _Importer, node, args, kwargs):
    dtype = imp.out_type().dtype
    base = 2.0 if node.target.overloadpacket.__name__ == "log2" else 10.0
    return imp.emit("mul", [imp.emit("log", [imp.cast(args[0], dtype)]),
                            imp.scalar(1.0 / np.log(base), dtype)])


@_handles("aten.isnan", "aten.isinf", "aten.isfinite", "aten.isposinf", "aten.isneginf")
def _float_class(imp: _Importer, node, args, kwargs):
    x, name = args[0], node.target.overloadpacket.__name__
    dtype = imp.type_of(x).dtype
    if _is_int(dtype):  # an integer is always finite
        return imp.scalar(np.full(_out_shape(imp), name == "isfinite"), "bool")
    inf = imp.scalar(np.inf, dtype)
    if name == "isnan":
        return imp.emit("ne", [x, x])
    if name == "isinf":
        return imp.emit("eq", [imp.emit("abs", [x]), inf])
    if name == "isposinf":
        return imp.emit("eq", [x, inf])
    if name == "isneginf":
        return imp.emit("eq", [x, imp.scalar(-np.inf, dtype)])
    return imp.emit("lt", [imp.emit("abs", [x]), inf])  # isfinite: NaN compares false


def _binary_op_handler(op: str, **attrs: Any) -> Handler:
    """`a op b` of the canonical `op` in the output dtype (tensors or python scalars)."""
    def handler(imp: _Importer, node, args, kwargs):
        dtype = imp.out_type().dtype
        return imp.emit(op, [imp.operand(args[0], dtype), imp.operand(args[1], dtype)], **attrs)
    return handler


HANDLERS["aten.atan2"] = _binary_op_handler("atan2")
HANDLERS["aten.remainder"] = _binary_op_handler("mod", fmod=False)
HANDLERS["aten.fmod"] = _binary_op_handler("mod", fmod=True)
HANDLERS["aten.max.other"] = _binary_op_handler("maximum")
HANDLERS["aten.min.other"] = _binary_op_handler("minimum")
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    HANDLERS[f"aten.{_name}"] = _binary_op_handler(_name)


@_handles("aten.logical_xor")
def _logical_xor(imp: _Importer, node, args, kwargs):
    return imp.emit("logical_xor", [imp.operand(a, "bool") for a in args[:2]])


def _bitwise(imp: _Importer, node, args, kwargs):
    """Bitwise operators: logical ones on bool, the integer ones otherwise."""
    name = node.target.overloadpacket.__name__.strip("_")
    if imp.out_type().dtype == "bool":
        op = {"and": "logical_and", "bitwise_and": "logical_and", "or": "logical_or",
              "bitwise_or": "logical_or", "xor": "logical_xor", "bitwise_xor": "logical_xor",
              "bitwise_not": "logical_not"}[name]
        arity = 1 if op == "logical_not" else 2
        return imp.emit(op, [imp.operand(a, "bool") for a in args[:arity]])
    op = {"and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor"}.get(name, name)
    dtype = imp.out_type().dtype
    if op == "bitwise_not":
        return imp.emit(op, [imp.cast(args[0], dtype)])
    return imp.emit(op, [imp.operand(args[0], dtype), imp.operand(args[1], dtype)])


for _name in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "__and__", "__or__",
              "__xor__"):
    HANDLERS[f"aten.{_name}"] = _bitwise


@_handles("aten.div.Tensor_mode", "aten.div.Scalar_mode", "aten.floor_divide")
def _div_rounded(imp: _Importer, node, args, kwargs):
    """div with a rounding mode: a true division when there is none, trunc(a / b) for floats
    rounded toward zero (what PyTorch computes), the exact rounded division otherwise."""
    name = node.target.overloadpacket.__name__
    mode = "floor" if name == "floor_divide" else kwargs.get("rounding_mode",
                                                             args[2] if len(args) > 2 else None)
    dtype = imp.out_type().dtype
    a, b = imp.operand(args[0], dtype), imp.operand(args[1], dtype)
    if mode is None:
        return imp.emit("div", [a, b])
    if mode == "trunc" and not _is_int(dtype):
        q = imp.emit("div", [a, b])
        zero = imp.scalar(0, dtype)
        return imp.emit("where", [imp.emit("lt", [q, zero]), imp.emit("ceil", [q]),
                                  imp.emit("floor", [q])])
    return imp.emit("divide_rounded", [a, b], mode=str(mode))


@_handles("aten.clamp.Tensor", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor",
          "aten.clamp.Tensor_out")
def _clamp_tensor(imp: _Importer, node, args, kwargs):
    """Clamping by tensors: max(x, lo), then min(., hi), so hi wins where lo > hi."""
    name = node.target.overloadpacket.__name__
    dtype = imp.out_type().dtype
    x = imp.cast(args[0], dtype)
    if name == "clamp_min":
        lo, hi = args[1], None
    elif name == "clamp_max":
        lo, hi = None, args[1]
    else:
        lo, hi = _arg(args, kwargs, 1, "min"), _arg(args, kwargs, 2, "max")
    if lo is not None:
        x = imp.emit("maximum", [x, imp.operand(lo, dtype)])
    if hi is not None:
        x = imp.emit("minimum", [x, imp.operand(hi, dtype)])
    return _broadcast(imp, x)


def _broadcast(imp: _Importer, x: Ref) -> Ref:
    """x expanded to the output shape (an elementwise result may be smaller than PyTorch's
    when a broadcasting operand was left out)."""
    shape = _out_shape(imp)
    if imp.type_of(x).shape == shape:
        return x
    return _expand(imp, imp.node, [x, list(shape)], {})


@_handles("aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default")
def _clamp_scalar(imp: _Importer, node, args, kwargs):
    if any(isinstance(a, Ref) for a in list(args[1:]) + list(kwargs.values())):
        return _clamp_tensor(imp, node, args, kwargs)
    return _clamp(imp, node, args, kwargs)


# --------------------------------------------------------------------- activations


def _select(imp: _Importer, cond: Ref, a: Ref, b: Ref) -> Ref:
    return imp.emit("where", [cond, a, b])


@_handles("aten.leaky_relu")
def _leaky_relu(imp: _Importer, node, args, kwargs):
    x, dtype = args[0], imp.out_type().dtype
    slope = float(_arg(args, kwargs, 1, "negative_slope", 0.01))
    zero = imp.scalar(0, dtype)
    return _select(imp, imp.emit("gt", [x, zero]), x,
                   imp.emit("mul", [x, imp.scalar(slope, dtype)]))


@_handles("aten.elu", "aten.celu", "aten.selu")
def _elu(imp: _Importer, node, args, kwargs):
    """elu(x) = scale * (x if x > 0 else alpha * expm1(x * input_scale)); celu and selu are
    elu with their constants."""
    x, dtype, name = args[0], imp.out_type().dtype, node.target.overloadpacket.__name__
    if name == "selu":
        alpha, scale, in_scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946, 1.0
    elif name == "celu":
        alpha = float(_arg(args, kwargs, 1, "alpha", 1.0))
        scale, in_scale = 1.0, 1.0 / alpha
    else:
        alpha = float(_arg(args, kwargs, 1, "alpha", 1.0))
        scale = float(_arg(args, kwargs, 2, "scale", 1.0))
        in_scale = float(_arg(args, kwargs, 3, "input_scale", 1.0))
    zero = imp.scalar(0, dtype)
    xs = x if in_scale == 1.0 else imp.emit("mul", [x, imp.scalar(in_scale, dtype)])
    neg = imp.emit("mul", [imp.emit("expm1", [xs]), imp.scalar(alpha * scale, dtype)])
    pos = x if scale == 1.0 else imp.emit("mul", [x, imp.scalar(scale, dtype)])
    return _select(imp, imp.emit("gt", [x, zero]), pos, neg)


def _softplus_ref(imp: _Importer, x: Ref, beta: float, threshold: float) -> Ref:
    """log1p(exp(beta x)) / beta, and x itself where beta x > threshold (PyTorch's rule)."""
    dtype = imp.type_of(x).dtype
    bx = x if beta == 1.0 else imp.emit("mul", [x, imp.scalar(beta, dtype)])
    soft = imp.emit("log1p", [imp.emit("exp", [bx])])
    if beta != 1.0:
        soft = imp.emit("div", [soft, imp.scalar(beta, dtype)])
    return _select(imp, imp.emit("gt", [bx, imp.scalar(threshold, dtype)]), x, soft)


@_handles("aten.softplus")
def _softplus(imp: _Importer, node, args, kwargs):
    return _softplus_ref(imp, args[0], float(_arg(args, kwargs, 1, "beta", 1.0)),
                         float(_arg(args, kwargs, 2, "threshold", 20.0)))


@_handles("aten.mish", "aten.mish_")
def _mish(imp: _Importer, node, args, kwargs):
    x = args[0]
    return imp.emit("mul", [x, imp.emit("tanh", [_softplus_ref(imp, x, 1.0, 20.0)])])


@_handles("aten.logit")
def _logit(imp: _Importer, node, args, kwargs):
    eps = _arg(args, kwargs, 1, "eps")
    if eps is not None:
        raise GraphError("logit with eps is not supported")
    x, dtype = args[0], imp.out_type().dtype
    return imp.emit("log", [imp.emit("div", [x, imp.emit("sub", [imp.scalar(1, dtype), x])])])


# --------------------------------------------------------------------- reductions (core set)


def _reduce_ref(imp: _Importer, op: str, x: Ref, dims: Any, keepdim: bool) -> Ref:
    return imp.emit(op, [x], axes=_dims(dims, len(imp.type_of(x).shape)), keepdims=bool(keepdim))


@_handles("aten.amin")
def _amin(imp: _Importer, node, args, kwargs):
    return _reduce_ref(imp, "min", args[0], _arg(args, kwargs, 1, "dim"),
                       _arg(args, kwargs, 2, "keepdim", False))


@_handles("aten.max.default", "aten.min.default")
def _extreme_all(imp: _Importer, node, args, kwargs):
    return _reduce_ref(imp, node.target.overloadpacket.__name__, args[0], None, False)


def _arg_extreme(imp: _Importer, x: Ref, dim: Any, keepdim: bool, largest: bool) -> Ref:
    """The index of the first largest (smallest) element along dim, or of the flattened
    tensor when dim is None (PyTorch's rule, NaN counting as the largest, as numpy's)."""
    shape = imp.type_of(x).shape
    if dim is None or not shape:
        flat = _reshape_to(imp, x, (int(np.prod(shape)),))
        found = imp.emit("arg_reduce", [flat], axis=0, keepdims=False, largest=largest)
        return _reshape_to(imp, found, _out_shape(imp))
    return imp.emit("arg_reduce", [x], axis=int(dim) % len(shape), keepdims=bool(keepdim),
                    largest=largest)


@_handles("aten.argmax", "aten.argmin")
def _argmax(imp: _Importer, node, args, kwargs):
    return _arg_extreme(imp, args[0], _arg(args, kwargs, 1, "dim"),
                        _arg(args, kwargs, 2, "keepdim", False),
                        node.target.overloadpacket.__name__ == "argmax")


@_handles("aten.max.dim", "aten.min.dim")
def _extreme_dim(imp: _Importer, node, args, kwargs):
    x, dim = args[0], _arg(args, kwargs, 1, "dim")
    keep = bool(_arg(args, kwargs, 2, "keepdim", False))
    name = node.target.overloadpacket.__name__
    rank = len(imp.type_of(x).shape)
    values = _reduce_ref(imp, name, x, [dim], keep)
    if rank == 0:
        return [values, imp.scalar(0, "int64")]
    return [values, _arg_extreme(imp, x, dim, keep, name == "max")]


@_handles("aten.any", "aten.all")
def _any(imp: _Importer, node, args, kwargs):
    """any: the largest of (x != 0) is 1; all: the smallest is 1 (as float32: te reduces
    numbers, not bools)."""
    x, name = args[0], node.target.overloadpacket.__name__
    dims = _arg(args, kwargs, 1, "dim")
    keep = bool(_arg(args, kwargs, 2, "keepdim", False))
    dtype = imp.type_of(x).dtype
    nonzero = x if dtype == "bool" else imp.emit("ne", [x, imp.scalar(0, dtype)])
    as_float = imp.cast(nonzero, "float32")
    red = _reduce_ref(imp, "max" if name == "any" else "min", as_float, dims, keep)
    result = imp.emit("gt", [red, imp.scalar(0.5, "float32")])
    return imp.cast(result, imp.out_type().dtype)


@_handles("aten.prod")
def _prod(imp: _Importer, node, args, kwargs):
    x = imp.cast(args[0], imp.out_type().dtype)
    if str(node.target).endswith(".default"):
        return _reduce_ref(imp, "prod", x, None, False)
    return _reduce_ref(imp, "prod", x, [_arg(args, kwargs, 1, "dim")],
                       _arg(args, kwargs, 2, "keepdim", False))


def _variance(imp: _Importer, x: Ref, dims: Any, correction: float, keepdim: bool) -> Ref:
    """sum((x - mean)^2) / max(0, n - correction) over dims, two passes as PyTorch does."""
    shape = imp.type_of(x).shape
    axes = _dims(dims, len(shape))
    n = int(np.prod([shape[a] for a in axes])) if shape else 1
    mean = imp.emit("mean", [x], axes=axes, keepdims=True)
    d = imp.emit("sub", [x, mean])
    total = imp.emit("sum", [imp.emit("mul", [d, d])], axes=axes, keepdims=bool(keepdim))
    dtype = imp.type_of(x).dtype
    return imp.emit("div", [total, imp.scalar(max(0.0, n - correction), dtype)])


def _correction(overload: str, args: list, kwargs: dict) -> tuple[Any, float, bool]:
    """(dims, correction, keepdim) of a var/std overload: .correction(x, dim, *, correction,
    keepdim), .dim(x, dim, unbiased, keepdim) or .default(x, unbiased)."""
    if overload == "correction":
        corr = kwargs.get("correction")
        return (_arg(args, kwargs, 1, "dim"), 1.0 if corr is None else float(corr),
                bool(kwargs.get("keepdim", False)))
    if overload == "dim":
        unbiased = _arg(args, kwargs, 2, "unbiased", True)
        return args[1], float(bool(unbiased)), bool(_arg(args, kwargs, 3, "keepdim", False))
    if overload == "default":
        return None, float(bool(_arg(args, kwargs, 1, "unbiased", True))), False
    raise GraphError(f"overload {overload!r} is not supported")


@_handles("aten.var", "aten.std")
def _var(imp: _Importer, node, args, kwargs):
    dims, corr, keep = _correction(str(node.target).rsplit(".", 1)[-1], list(args), kwargs)
    v = _variance(imp, args[0], dims, corr, keep)
    if node.target.overloadpacket.__name__ == "std":
        v = imp.emit("sqrt", [v])
    return v


@_handles("aten.cumsum")
def _cumsum(imp: _Importer, node, args, kwargs):
    x = imp.cast(args[0], imp.out_type().dtype)
    rank = len(imp.type_of(x).shape)
    if rank == 0:
        return x
    return imp.emit("cumsum", [x], axis=int(_arg(args, kwargs, 1, "dim")) % rank)


@_handles("aten.sort", "aten.topk")
def _sort(imp: _Importer, node, args, kwargs):
    """Values and indices, sorted; equal values keep their order (a stable sort, which
    PyTorch's CPU sort is)."""
    x = args[0]
    shape = imp.type_of(x).shape
    if str(node.target) == "aten.topk.default":
        k = int(args[1])
        dim = int(_arg(args, kwargs, 2, "dim", -1))
        largest = bool(_arg(args, kwargs, 3, "largest", True))
        if not bool(_arg(args, kwargs, 4, "sorted", True)):
            raise GraphError("topk with sorted=False (an unspecified order) is not supported")
    else:
        if str(node.target) == "aten.sort.stable":
            dim, largest = int(kwargs.get("dim", -1)), bool(kwargs.get("descending", False))
        else:
            dim = int(_arg(args, kwargs, 1, "dim", -1))
            largest = bool(_arg(args, kwargs, 2, "descending", False))
        k = shape[dim % len(shape)] if shape else 1
    if not shape:
        return [x, imp.scalar(0, "int64")]
    axis = dim % len(shape)
    return [imp.emit("topk", [x], k=k, axis=axis, largest=largest, indices=False),
            imp.emit("topk", [x], k=k, axis=axis, largest=largest, indices=True)]


# --------------------------------------------------------------------- data movement


def _traced_gather(imp: _Importer, node, args, kwargs) -> Ref:
    """An operator that only moves elements (flip, roll, repeat, diagonal, as_strided, the
    scatters of one slice): PyTorch runs it at import on tensors of element numbers, which
    says where each output element comes from; the graph gathers the elements of its tensor
    arguments, flattened and joined, at those numbers (a constant index)."""
    import torch

    dtype = imp.out_type().dtype
    sources: list[Ref] = []

    def number(o: Any) -> Any:
        if isinstance(o, Ref):
            shape = imp.type_of(o).shape
            start = sum(int(np.prod(imp.type_of(s).shape)) for s in sources)
            sources.append(o)
            return torch.arange(start, start + int(np.prod(shape)), dtype=torch.int64).reshape(shape)
        if isinstance(o, (list, tuple)):
            return type(o)(number(v) for v in o)
        return o

    with torch.no_grad():
        ids = node.target(*number(list(args)), **{k: number(v) for k, v in kwargs.items()})
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64:
        raise GraphError("the operator does not only move elements")
    flat = [_reshape_to(imp, imp.cast(s, dtype), (int(np.prod(imp.type_of(s).shape)),))
            for s in sources]
    table = flat[0] if len(flat) == 1 else imp.emit("concat", flat, axis=0)
    return imp.emit("index", [table, imp.scalar(ids.contiguous().numpy(), "int64")])


@_handles("aten.flip", "aten.roll", "aten.repeat", "aten.diagonal", "aten.select_scatter",
          "aten.slice_scatter", "aten.unfold", "aten.narrow", "aten.movedim", "aten.tile",
          "aten.rot90", "aten.diag_embed", "aten.pixel_shuffle", "aten.pixel_unshuffle",
          "aten.channel_shuffle", "aten.diagonal_scatter")
def _moving(imp: _Importer, node, args, kwargs):
    name = node.target.overloadpacket.__name__
    if name == "diag_embed":
        raise GraphError("diag_embed fills zeros; it is not a pure data movement")
    # only the moved tensors may be tensors: a tensor position or count (narrow.Tensor) would
    # be numbered like data
    data = 2 if name.endswith("_scatter") else 1
    if any(isinstance(a, Ref) for a in list(args[data:]) + list(kwargs.values())):
        raise GraphError("a tensor argument that is not the data moved is not supported")
    return _traced_gather(imp, node, args, kwargs)


@_handles("aten.as_strided")
def _as_strided(imp: _Importer, node, args, kwargs):
    """as_strided reads the storage of its input: the input must be a contiguous value (a
    graph input or an operator's result), which is what the numbered tensor stands for."""
    val = node.args[0].meta.get("val")
    if val is None or not val.is_contiguous() or val.storage_offset() != 0:
        raise GraphError("as_strided of a non-contiguous view is not supported")
    return _traced_gather(imp, node, args, kwargs)


@_handles("aten.fill", "aten.full_like", "aten.zeros_like", "aten.ones_like", "aten.new_full",
          "aten.new_zeros", "aten.new_ones", "aten.fill_")
def _value_of_shape(imp: _Importer, node, args, kwargs):
    """Operators whose result depends on their tensor argument's shape alone (or on a fill
    value that is a tensor, broadcast)."""
    import torch

    value = args[1] if len(args) > 1 else None
    if node.target.overloadpacket.__name__.startswith("fill") and isinstance(value, Ref):
        return _broadcast(imp, imp.cast(value, imp.out_type().dtype))

    def shaped(o: Any) -> Any:
        if isinstance(o, Ref):
            t = imp.type_of(o)
            return torch.zeros(t.shape, dtype=getattr(torch, t.dtype))
        return o

    with torch.no_grad():
        result = node.target(*[shaped(a) for a in args], **{k: shaped(v) for k, v in kwargs.items()})
    return imp._constant(result)


@_handles("aten.copy")
def _copy(imp: _Importer, node, args, kwargs):
    return _broadcast(imp, imp.cast(args[1], imp.out_type().dtype))


@_handles("aten.gather")
def _gather(imp: _Importer, node, args, kwargs):
    """out[i][j] = x[index[i][j]][j] along dim; PyTorch lets the index be smaller than x on
    the other axes, which then read x's leading part."""
    x, dim, index = args[0], int(args[1]), args[2]
    shape, ishape = imp.type_of(x).shape, imp.type_of(index).shape
    if not shape:
        x = _reshape_to(imp, x, (1,))
        index = _reshape_to(imp, index, (1,))
        return _reshape_to(imp, imp.emit("gather_elements", [x, index], axis=0), _out_shape(imp))
    axis = dim % len(shape)
    if not ishape:
        index = _reshape_to(imp, index, (1,) * len(shape))
        ishape = imp.type_of(index).shape
    for d, n in enumerate(ishape):
        if d != axis and n < shape[d]:
            x = _slice_ref(imp, x, d, 0, n, 1)
    return _reshape_to(imp, imp.emit("gather_elements", [x, imp.cast(index, "int64")], axis=axis),
                       _out_shape(imp))


_SCATTER_REDUCTIONS = {None: "none", "sum": "add", "add": "add", "prod": "mul",
                       "multiply": "mul", "amax": "max", "amin": "min"}


@_handles("aten.scatter", "aten.scatter_add", "aten.scatter_reduce")
def _scatter_any_rank(imp: _Importer, node, args, kwargs):
    """Rank-0 operands scatter as tensors of one element."""
    args = list(args)
    if imp.type_of(args[0]).shape and imp.type_of(args[2]).shape:
        return _scatter(imp, node, args, kwargs)
    one = [_reshape_to(imp, a, (1,)) if isinstance(a, Ref) else a for a in args]
    kw = {k: _reshape_to(imp, v, (1,)) if isinstance(v, Ref) else v for k, v in kwargs.items()}
    one[1] = 0
    return _reshape_to(imp, _scatter(imp, node, one, kw), _out_shape(imp))


def _scatter(imp: _Importer, node, args, kwargs):
    """x with src written (or combined) at index along dim; src may be larger than index on
    every axis (its leading part is read) or a scalar."""
    x, dim, index = args[0], int(args[1]), args[2]
    name, overload = node.target.overloadpacket.__name__, str(node.target).rsplit(".", 1)[-1]
    src = args[3] if len(args) > 3 else kwargs.get("src", kwargs.get("value"))
    include_self = True
    if name == "scatter_add":
        reduce = "sum"
    elif name == "scatter_reduce":
        reduce = args[4] if len(args) > 4 else kwargs["reduce"]
        include_self = bool(_arg(args, kwargs, 5, "include_self", True))
    else:
        reduce = kwargs.get("reduce", args[4] if len(args) > 4 else None)
    if reduce == "mean" or not include_self:
        return _scatter_reduce_general(imp, x, dim, index, src, reduce, include_self)
    if reduce not in _SCATTER_REDUCTIONS:
        raise GraphError(f"scatter reduction {reduce!r} is not supported")
    dtype = imp.out_type().dtype
    shape, ishape = imp.type_of(x).shape, imp.type_of(index).shape
    if not shape or not ishape:
        raise GraphError("scatter on rank-0 tensors is not supported")
    axis = dim % len(shape)
    if isinstance(src, Ref) and "value" not in overload:
        for d, n in enumerate(ishape):
            if n < imp.type_of(src).shape[d]:
                src = _slice_ref(imp, src, d, 0, n, 1)
        src = imp.cast(src, dtype)
    else:
        src = imp.emit("expand", [_reshape_to(imp, imp.operand(src, dtype), (1,) * len(ishape))],
                       shape=ishape) if ishape != (1,) * len(ishape) else \
            _reshape_to(imp, imp.operand(src, dtype), ishape)
    return imp.emit("scatter_elements", [imp.cast(x, dtype), imp.cast(index, "int64"), src],
                    axis=axis, reduction=_SCATTER_REDUCTIONS[reduce])


@_handles("aten.index_select")
def _index_select(imp: _Importer, node, args, kwargs):
    """x.index_select(dim, ids): the rows of x along dim, as an embedding lookup of x with
    dim moved to the front (ids in [0, n), as PyTorch requires)."""
    x, dim, ids = args[0], int(args[1]), args[2]
    shape = imp.type_of(x).shape
    if not shape:
        x, shape = _reshape_to(imp, x, (1,)), (1,)
    axis = dim % len(shape)
    ids = _reshape_to(imp, imp.cast(ids, "int64"), (int(np.prod(imp.type_of(ids).shape)),))
    order = (axis,) + tuple(d for d in range(len(shape)) if d != axis)
    front = x if axis == 0 else imp.emit("permute", [x], axes=order)
    rest = tuple(shape[d] for d in order[1:])
    table = _reshape_to(imp, front, (shape[axis], int(np.prod(rest))))
    rows = imp.emit("embedding", [table, ids], negative_ids=False)
    picked = _reshape_to(imp, rows, (imp.type_of(ids).shape[0],) + rest)
    if axis != 0:
        picked = imp.emit("permute", [picked], axes=tuple(int(i) for i in np.argsort(order)))
    return _reshape_to(imp, picked, _out_shape(imp))


@_handles("aten.index_put")
def _index_put(imp: _Importer, node, args, kwargs):
    """x[i0, i1, ...] = values (or += with accumulate): the index tensors broadcast together
    and address x's leading axes, as index tuples of a scatter."""
    x, indices, values = args[0], list(args[1]), args[2]
    accumulate = bool(_arg(args, kwargs, 3, "accumulate", False))
    if any(i is None for i in indices):
        raise GraphError("index_put that skips an axis is not supported")
    if any(imp.type_of(i).dtype == "bool" for i in indices):
        return _index_put_mask(imp, x, indices, values, accumulate)
    shape, dtype = imp.type_of(x).shape, imp.out_type().dtype
    k = len(indices)
    batch = tuple(int(d) for d in np.broadcast_shapes(*(imp.type_of(i).shape for i in indices)))
    cols = []
    for i in indices:
        i = imp.cast(i, "int64")
        if imp.type_of(i).shape != batch:
            i = imp.emit("expand", [_reshape_to(imp, i, (1,) * (len(batch) - len(imp.type_of(i).shape))
                                                + imp.type_of(i).shape)], shape=batch)
        cols.append(_reshape_to(imp, i, batch + (1,)))
    tuples = cols[0] if k == 1 else imp.emit("concat", cols, axis=len(batch))
    target = batch + shape[k:]
    values = imp.cast(values, dtype)
    vshape = imp.type_of(values).shape
    if vshape != target:
        values = _reshape_to(imp, values, (1,) * (len(target) - len(vshape)) + vshape)
        values = imp.emit("expand", [values], shape=target)
    if accumulate:
        return imp.emit("scatter_nd", [x, tuples, values], reduction="add")
    return imp.emit("scatter_nd", [x, tuples, values])


@_handles("aten.masked_scatter")
def _masked_scatter_h(imp: _Importer, node, args, kwargs):
    x, mask, source = args[0], args[1], args[2]
    dtype = imp.out_type().dtype
    x = _broadcast(imp, imp.cast(x, dtype))
    return imp.emit("masked_scatter", [x, imp.cast(mask, "bool"), imp.cast(source, dtype)])


@_handles("aten.nonzero", "aten.nonzero_numpy", "aten.nonzero_static", "aten.unique",
          "aten._unique2", "aten.masked_select")
def _data_dependent(imp: _Importer, node, args, kwargs):
    raise GraphError("its output shape depends on the data")


# --------------------------------------------------------------------- pooling, padding, resizing


def _pool_any_rank(handler2d: Handler, one_d: bool, roles: Sequence[str]) -> Handler:
    """A 2-d pooling handler made to take 1-d pools (height 1) and unbatched inputs: `roles`
    names the arguments after the input ("kernel", "stride", "padding", "dilation", "size" or
    "" for one left as it is)."""
    def handler(imp: _Importer, node, args, kwargs):
        x, shape = args[0], imp.type_of(args[0]).shape
        spatial = 1 if one_d else 2
        if len(shape) not in (spatial + 1, spatial + 2):
            raise GraphError(f"input of rank {len(shape)} for a {spatial}-d pool")
        lead = shape[:-spatial] if len(shape) == spatial + 2 else (1,) + shape[:-spatial]
        x4 = _reshape_to(imp, x, lead + ((1,) if one_d else ()) + shape[-spatial:])
        rest = list(args[1:])
        if one_d:
            for i, role in enumerate(roles[:len(rest)]):
                v = rest[i]
                v = v[0] if isinstance(v, (list, tuple)) and v else v
                if role in ("kernel", "dilation", "size"):
                    rest[i] = [1, int(v)]
                elif role == "stride":
                    rest[i] = [] if v is None or v == [] else [1, int(v)]
                elif role == "padding":
                    rest[i] = [0, int(v)]
        y = handler2d(imp, node, [x4] + rest, kwargs)
        if isinstance(y, list):
            return [r if r is None else _reshape_to(imp, r, tuple(int(d) for d in v.shape))
                    for r, v in zip(y, node.meta["val"])]
        return _reshape_to(imp, y, _out_shape(imp))
    return handler


_MAX_ROLES = ("kernel", "stride", "padding", "dilation", "")
_AVG_ROLES = ("kernel", "stride", "padding", "", "", "")
HANDLERS["aten.max_pool2d"] = _pool_any_rank(_max_pool2d, False, _MAX_ROLES)
HANDLERS["aten.max_pool2d_with_indices"] = _pool_any_rank(_max_pool2d, False, _MAX_ROLES)
HANDLERS["aten.max_pool1d"] = _pool_any_rank(_max_pool2d, True, _MAX_ROLES)
HANDLERS["aten.max_pool1d_with_indices"] = _pool_any_rank(_max_pool2d, True, _MAX_ROLES)
HANDLERS["aten.avg_pool2d"] = _pool_any_rank(_avg_pool2d, False, _AVG_ROLES)
HANDLERS["aten.avg_pool1d"] = _pool_any_rank(_avg_pool2d, True, _AVG_ROLES)
HANDLERS["aten.adaptive_avg_pool2d"] = _pool_any_rank(_adaptive_avg_pool2d, False, ("size",))
HANDLERS["aten._adaptive_avg_pool2d"] = _pool_any_rank(_adaptive_avg_pool2d, False, ("size",))
HANDLERS["aten.adaptive_avg_pool1d"] = _pool_any_rank(_adaptive_avg_pool2d, True, ("size",))


def _pairs(imp: _Importer, x: Ref, pad: Sequence[int]) -> list[tuple[int, int]]:
    """PyTorch's flat padding list (last axis first) as one (before, after) pair per axis."""
    rank = len(imp.type_of(x).shape)
    pairs = [(0, 0)] * rank
    for i in range(len(pad) // 2):
        pairs[rank - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return pairs


def _crop(imp: _Importer, x: Ref, pairs: list[tuple[int, int]]) -> tuple[Ref, list[tuple[int, int]]]:
    """Negative padding removes cells: slice them off, leaving the non-negative padding."""
    shape = imp.type_of(x).shape
    for axis, (lo, hi) in enumerate(pairs):
        if lo < 0 or hi < 0:
            x = _slice_ref(imp, x, axis, max(0, -lo), shape[axis] - max(0, -hi), 1)
    return x, [(max(0, lo), max(0, hi)) for lo, hi in pairs]


_BORDER_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@_handles("aten.pad", "aten.constant_pad_nd", "aten.reflection_pad1d", "aten.reflection_pad2d",
          "aten.reflection_pad3d", "aten.replication_pad1d", "aten.replication_pad2d",
          "aten.replication_pad3d", "aten._pad_circular")
def _pad_modes(imp: _Importer, node, args, kwargs):
    """Constant padding (negative amounts crop), and padding from the border: reflect,
    replicate, circular."""
    name = node.target.overloadpacket.__name__
    x, pad = args[0], list(args[1])
    value = 0.0
    if name == "pad":
        mode = _arg(args, kwargs, 2, "mode", "constant")
        value = _arg(args, kwargs, 3, "value", None)
    elif name == "constant_pad_nd":
        mode, value = "constant", _arg(args, kwargs, 2, "value", 0)
    else:
        mode = "circular" if "circular" in name else name.split("_")[0]
    pairs = _pairs(imp, x, pad)
    if mode == "constant":
        x, pairs = _crop(imp, x, pairs)
        if not any(lo or hi for lo, hi in pairs):
            return x
        return imp.emit("pad", [x], pads=tuple(pairs), value=float(value or 0.0))
    if mode not in _BORDER_MODES:
        raise GraphError(f"pad mode {mode!r} is not supported")
    if any(lo < 0 or hi < 0 for lo, hi in pairs):
        raise GraphError(f"negative padding in mode {mode!r} is not supported")
    shape = imp.type_of(x).shape
    limit = {"reflect": lambda n: n - 1, "replicate": lambda n: 1 << 62, "circular": lambda n: n}[mode]
    if any(max(lo, hi) > limit(n) for (lo, hi), n in zip(pairs, shape)):
        raise GraphError(f"padding {pad} is too large for mode {mode!r} on {shape}")
    return imp.emit("pad_border", [x], pads=tuple(pairs), mode=_BORDER_MODES[mode])


@_handles("aten.upsample_nearest1d", "aten.upsample_nearest2d", "aten.upsample_nearest3d",
          "aten._upsample_nearest_exact1d", "aten._upsample_nearest_exact2d",
          "aten._upsample_nearest_exact3d")
def _upsample_nearest(imp: _Importer, node, args, kwargs):
    """Nearest resampling moves elements: PyTorch runs it at import on float32 element
    numbers (exact below 2^24), so the source index of every output element is PyTorch's own
    float32 computation."""
    import torch

    x = args[0]
    n = int(np.prod(imp.type_of(x).shape))
    if n >= 1 << 24:
        raise GraphError("nearest resampling of more than 2^24 elements is not supported")
    with torch.no_grad():
        numbers = torch.arange(n, dtype=torch.float32).reshape(imp.type_of(x).shape)
        ids = node.target(numbers, *args[1:], **kwargs).to(torch.int64)
    flat = _reshape_to(imp, x, (n,))
    return imp.emit("index", [flat, imp.scalar(ids.contiguous().numpy(), "int64")])


@_handles("aten.upsample_bilinear2d", "aten.upsample_linear1d")
def _upsample_linear(imp: _Importer, node, args, kwargs):
    """Linear resampling as the canonical resize: PyTorch's source coordinate is
    (i + 0.5) * scale - 0.5 clamped at 0 (half_pixel with edge values), or i * (n - 1) /
    (m - 1) with align_corners; the scale is 1 / scale_factor when one is given."""
    x = args[0]
    shape = imp.type_of(x).shape
    align = bool(_arg(args, kwargs, 2, "align_corners", False))
    factors = _arg(args, kwargs, 3, "scale_factors")
    if str(node.target).endswith(".default"):  # (x, output_size, align_corners, scales...)
        factors = [f for f in args[3:] if f is not None] or None
    spatial = 1 if "1d" in str(node.target) else 2
    out = _out_shape(imp)
    attrs: dict[str, Any] = {"sizes": out, "mode": "linear",
                             "coordinate_transformation_mode": "align_corners" if align else "half_pixel"}
    if factors and not align:
        if len(factors) != spatial:
            raise GraphError(f"scale factors {factors} for {spatial} spatial axes")
        attrs["scales"] = (1.0,) * (len(shape) - spatial) + tuple(float(f) for f in factors)
    if not align and not factors:
        attrs["scales"] = (1.0,) * (len(shape) - spatial) + tuple(
            o / i for o, i in zip(out[-spatial:], shape[-spatial:]))
    return imp.emit("resize", [x], **attrs)


# --------------------------------------------------------------------- normalization statistics


def _normalize(imp: _Importer, x: Ref, axes: tuple[int, ...], eps: float) -> tuple[Ref, Ref, Ref]:
    """(x - mean) * rstd over `axes`, and mean and rstd = 1 / sqrt(biased var + eps), kept as
    axes of size 1."""
    dtype = imp.type_of(x).dtype
    mean = imp.emit("mean", [x], axes=axes, keepdims=True)
    d = imp.emit("sub", [x, mean])
    var = imp.emit("mean", [imp.emit("mul", [d, d])], axes=axes, keepdims=True)
    rstd = imp.emit("rsqrt", [imp.emit("add", [var, imp.scalar(eps, dtype)])])
    return imp.emit("mul", [d, rstd]), mean, rstd


def _affine(imp: _Importer, y: Ref, w: Any, b: Any, shape: tuple[int, ...]) -> Ref:
    """y * w + b with w and b reshaped to `shape` (None: left out)."""
    if w is not None:
        y = imp.emit("mul", [y, _reshape_to(imp, w, shape)])
    if b is not None:
        y = imp.emit("add", [y, _reshape_to(imp, b, shape)])
    return y


@_handles("aten.native_layer_norm")
def _native_layer_norm_stats(imp: _Importer, node, args, kwargs):
    """The normalized output (the canonical layer_norm), and the mean and rstd PyTorch also
    returns (shape: the leading axes, then ones)."""
    x, shape = args[0], list(args[1])
    rank = len(imp.type_of(x).shape)
    axes = tuple(range(rank - len(shape), rank))
    out = _layer_norm(imp, node, list(args), kwargs)
    _, mean, rstd = _normalize(imp, x, axes, float(_arg(args, kwargs, 4, "eps", 1e-5)))
    return [out, mean, rstd]


@_handles("aten.group_norm", "aten.native_group_norm")
def _group_norm(imp: _Importer, node, args, kwargs):
    """Statistics over each group of channels (and all spatial positions) of each sample;
    native_group_norm also returns them as [N, groups]."""
    x = args[0]
    shape = imp.type_of(x).shape
    if node.target.overloadpacket.__name__ == "group_norm":
        groups, w, b = int(args[1]), _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")
        eps = float(_arg(args, kwargs, 4, "eps", 1e-5))
    else:
        w, b, groups, eps = args[1], args[2], int(args[6]), float(args[7])
    n, c = shape[0], shape[1]
    grouped = _reshape_to(imp, x, (n, groups, int(np.prod(shape)) // (n * groups)))
    y, mean, rstd = _normalize(imp, grouped, (2,), eps)
    y = _affine(imp, _reshape_to(imp, y, shape), w, b, (c,) + (1,) * (len(shape) - 2))
    if node.target.overloadpacket.__name__ == "group_norm":
        return y
    return [y, _reshape_to(imp, mean, (n, groups)), _reshape_to(imp, rstd, (n, groups))]


def _bn_training(imp: _Importer, x: Ref, w: Any, b: Any, running_mean: Any, running_var: Any,
                 momentum: float, eps: float) -> list:
    """Batch norm on the batch's own statistics: (out, mean, rstd, the running mean and
    variance updated as PyTorch does, with the unbiased variance)."""
    shape, dtype = imp.type_of(x).shape, imp.type_of(x).dtype
    c = shape[1]
    axes = tuple(d for d in range(len(shape)) if d != 1)
    y, mean, rstd = _normalize(imp, x, axes, eps)
    y = _affine(imp, y, w, b, (c,) + (1,) * (len(shape) - 2))
    mean_c = _reshape_to(imp, mean, (c,))
    rstd_c = _reshape_to(imp, rstd, (c,))
    outs = [y, mean_c, rstd_c]
    if running_mean is not None:
        count = int(np.prod(shape)) // c
        d = imp.emit("sub", [x, mean])
        var = imp.emit("sum", [imp.emit("mul", [d, d])], axes=axes, keepdims=False)
        unbiased = imp.emit("div", [var, imp.scalar(max(count - 1, 0), dtype)])
        keep, take = imp.scalar(1.0 - momentum, dtype), imp.scalar(momentum, dtype)
        outs.append(imp.emit("add", [imp.emit("mul", [running_mean, keep]), imp.emit("mul", [mean_c, take])]))
        outs.append(imp.emit("add", [imp.emit("mul", [running_var, keep]), imp.emit("mul", [unbiased, take])]))
    return outs


@_handles("aten._native_batch_norm_legit_functional", "aten._native_batch_norm_legit",
          "aten.native_batch_norm", "aten._native_batch_norm_legit.no_stats")
def _bn_any(imp: _Importer, node, args, kwargs):
    name, overload = node.target.overloadpacket.__name__, str(node.target).rsplit(".", 1)[-1]
    if overload == "no_stats":
        x, w, b, training, momentum, eps = args
        rm = rv = None
    else:
        x, w, b, rm, rv, training, momentum, eps = args
    if not training:
        if rm is None:
            raise GraphError("batch norm in eval mode without running statistics")
        out = _bn(imp, x, w, b, rm, rv, eps)  # the statistics PyTorch returns are empty here
        empty = [Ref(imp.graph.add_constant(np.empty(tuple(v.shape), dtype=torch_dtype_name(v.dtype))))
                 for v in node.meta["val"][1:3]]
        return [out] + empty + ([rm, rv] if name.endswith("functional") else [])
    outs = _bn_training(imp, x, w, b, rm, rv, float(momentum), float(eps))
    if name.endswith("functional"):
        return outs
    return outs[:3]


_REDUCE_IDENTITY = {"sum": 0, "mean": 0, "prod": 1, "amax": -np.inf, "amin": np.inf}


def _scatter_reduce_general(imp: _Importer, x: Ref, dim: int, index: Ref, src: Ref, reduce: str,
                            include_self: bool) -> Ref:
    """scatter_reduce without x's own values (include_self=False: the places written start
    from the reduction's identity) and the mean (the sum divided by the count of values
    combined, x's own value counted when included; integer means round down, as PyTorch)."""
    if reduce not in _REDUCE_IDENTITY:
        raise GraphError(f"scatter reduction {reduce!r} is not supported")
    dtype = imp.out_type().dtype
    shape, ishape = imp.type_of(x).shape, imp.type_of(index).shape
    if not shape or not ishape or not isinstance(src, Ref):
        raise GraphError("scatter_reduce on rank-0 tensors or with a scalar source is not supported")
    axis = dim % len(shape)
    for d, n in enumerate(ishape):
        if n < imp.type_of(src).shape[d]:
            src = _slice_ref(imp, src, d, 0, n, 1)
    src, index, x = imp.cast(src, dtype), imp.cast(index, "int64"), imp.cast(x, dtype)
    identity = _REDUCE_IDENTITY[reduce]
    if _is_int(dtype) and not np.isfinite(identity):
        identity = np.iinfo(dtype).min if identity < 0 else np.iinfo(dtype).max
    base = x
    if not include_self:
        fill = imp.scalar(np.full(ishape, identity), dtype)
        base = imp.emit("scatter_elements", [x, index, fill], axis=axis)
    combined = imp.emit("scatter_elements", [base, index, src], axis=axis,
                        reduction=_SCATTER_REDUCTIONS["sum" if reduce == "mean" else reduce])
    if reduce != "mean":
        return combined
    start = imp.scalar(np.ones(shape), dtype)
    if not include_self:
        start = imp.emit("scatter_elements", [start, index, imp.scalar(np.zeros(ishape), dtype)],
                         axis=axis)
    count = imp.emit("scatter_elements", [start, index, imp.scalar(np.ones(ishape), dtype)],
                     axis=axis, reduction="add")
    count = imp.emit("maximum", [count, imp.scalar(1, dtype)])  # untouched places keep x
    if _is_int(dtype):
        return imp.emit("divide_rounded", [combined, count], mode="floor")
    return imp.emit("div", [combined, count])


def _index_put_mask(imp: _Importer, x: Ref, indices: list, values: Ref, accumulate: bool) -> Ref:
    """x[mask] = values with one boolean mask over x's leading axes: a select where the
    values are one element (or one row), else the mask's places filled in row-major order."""
    if len(indices) != 1:
        raise GraphError("index_put with a boolean mask among other indices is not supported")
    mask, dtype = indices[0], imp.out_type().dtype
    shape, mshape = imp.type_of(x).shape, imp.type_of(mask).shape
    if shape[:len(mshape)] != mshape:
        raise GraphError(f"boolean mask {mshape} for a tensor {shape}")
    mask = _reshape_to(imp, mask, mshape + (1,) * (len(shape) - len(mshape)))
    values = imp.cast(values, dtype)
    vshape = imp.type_of(values).shape
    rest = shape[len(mshape):]
    if int(np.prod(vshape)) == 1 or vshape[-len(rest):] == rest and int(np.prod(vshape)) == int(np.prod(rest)):
        row = _reshape_to(imp, values, (1,) * len(mshape) + (rest if int(np.prod(vshape)) > 1 else (1,) * len(rest)))
        new = imp.emit("add", [x, row]) if accumulate else row
        return _broadcast(imp, imp.emit("where", [mask, new, x]))
    if accumulate:
        raise GraphError("index_put with a boolean mask and accumulate=True is not supported")
    full_mask = imp.emit("expand", [mask], shape=shape) if imp.type_of(mask).shape != shape else mask
    return imp.emit("masked_scatter", [x, full_mask, values])


@_handles("aten.max_pool2d_with_indices_backward")
def _max_pool2d_backward(imp: _Importer, node, args, kwargs):
    """The gradient of a max pool: each output's gradient added at the input cell its index
    names (in the flattened plane of its channel)."""
    grad, x, indices = args[0], args[1], args[7]
    shape, dtype = imp.type_of(x).shape, imp.out_type().dtype
    lead, plane = shape[:-2], shape[-2] * shape[-1]
    gshape = imp.type_of(grad).shape
    count = gshape[-2] * gshape[-1]
    zeros = imp.scalar(np.zeros(lead + (plane,)), dtype)
    flat_ids = _reshape_to(imp, imp.cast(indices, "int64"), lead + (count,))
    flat_grad = _reshape_to(imp, imp.cast(grad, dtype), lead + (count,))
    summed = imp.emit("scatter_elements", [zeros, flat_ids, flat_grad], axis=len(lead),
                      reduction="add")
    return _reshape_to(imp, summed, shape)


# --------------------------------------------------------------------- transposed convolution


def _moved(imp: _Importer, x: Ref, fn: Callable[[Any], Any]) -> Ref:
    """fn (a function that only moves elements) applied to x: on the array itself when x is
    a constant (a weight), else as a gather at the places fn moves element numbers to."""
    import torch

    t = imp.type_of(x)
    if imp.graph.is_constant(x.name):
        return imp._constant(fn(torch.from_numpy(imp.graph.constants[x.name].copy())))
    ids = fn(torch.arange(int(np.prod(t.shape)), dtype=torch.int64).reshape(t.shape))
    flat = _reshape_to(imp, x, (int(np.prod(t.shape)),))
    return imp.emit("index", [flat, imp.scalar(ids.contiguous().numpy(), "int64")])


def _conv_transpose(imp: _Importer, x: Ref, w: Ref, b: Any, stride: Any, padding: Any,
                    output_padding: Any, groups: int, dilation: Any) -> Ref:
    """A transposed convolution as the convolution it is the gradient of: the input spread
    out by the stride (zeros between its elements), padded by dilation * (k - 1) - padding
    (plus output_padding at the end; a negative amount crops), convolved at stride 1 with the
    weight flipped and its in/out channels swapped within each group."""
    wshape = imp.type_of(w).shape
    if len(wshape) not in (3, 4):
        if len(wshape) == 5:  # three spatial axes: the canonical conv_transpose (numpy kernels)
            pads = tuple((p, p) for p in _triple(padding, 0))
            y = imp.emit("conv_transpose", [_batched5(imp, x), w] + ([b] if b is not None else []),
                         stride=_triple(stride, 1), pads=pads, output_padding=_triple(output_padding, 0),
                         groups=int(groups), dilation=_triple(dilation, 1))
            return _reshape_to(imp, y, _out_shape(imp))
        raise GraphError(f"only 1-d to 3-d transposed convolutions are supported (weight {wshape})")
    one_d = len(wshape) == 3

    def pair(v: Any, fill: int) -> tuple[int, int]:
        if one_d:
            v = v[0] if isinstance(v, (list, tuple)) else v
            return (fill, int(v))
        return _pair(v)

    stride, padding, out_pad, dilation = (pair(stride, 1), pair(padding, 0), pair(output_padding, 0),
                                          pair(dilation, 1))
    xshape = imp.type_of(x).shape
    batched = len(xshape) == len(wshape)
    x4 = _reshape_to(imp, x, ((1,) if not batched else ()) + xshape[:-1 if one_d else len(xshape)]
                     + ((1, xshape[-1]) if one_d else ()))
    w4 = _reshape_to(imp, w, wshape[:2] + (1, wshape[2]) if one_d else wshape)
    n, c, h, wd = imp.type_of(x4).shape
    cin, cout_g, kh, kw = imp.type_of(w4).shape
    g = int(groups)
    (sh, sw) = stride
    if (sh, sw) != (1, 1):
        spread = _reshape_to(imp, x4, (n, c, h, 1, wd, 1))
        spread = imp.emit("pad", [spread], pads=((0, 0), (0, 0), (0, 0), (0, sh - 1), (0, 0), (0, sw - 1)),
                          value=0.0)
        spread = _reshape_to(imp, spread, (n, c, h * sh, wd * sw))
        spread = _slice_ref(imp, spread, 2, 0, (h - 1) * sh + 1, 1)
        x4 = _slice_ref(imp, spread, 3, 0, (wd - 1) * sw + 1, 1)
    pairs = [(0, 0), (0, 0)]
    for k, p, op, d in zip((kh, kw), padding, out_pad, dilation):
        q = d * (k - 1) - p
        pairs.append((q, q + op))
    x4, pairs = _crop(imp, x4, pairs)
    if any(lo or hi for lo, hi in pairs):
        x4 = imp.emit("pad", [x4], pads=tuple(pairs), value=0.0)
    flipped = _moved(imp, w4, lambda t: t.reshape(g, cin // g, cout_g, kh, kw).permute(0, 2, 1, 3, 4)
                     .flip(3, 4).reshape(g * cout_g, cin // g, kh, kw))
    inputs = [x4, flipped] + ([b] if b is not None else [])
    y = imp.emit("conv2d", inputs, stride=(1, 1), padding=(0, 0), dilation=tuple(dilation), groups=g)
    return _reshape_to(imp, y, _out_shape(imp))


@_handles("aten.conv_transpose1d", "aten.conv_transpose2d")
def _conv_transpose_h(imp: _Importer, node, args, kwargs):
    return _conv_transpose(imp, args[0], args[1], _arg(args, kwargs, 2, "bias"),
                           _arg(args, kwargs, 3, "stride", 1), _arg(args, kwargs, 4, "padding", 0),
                           _arg(args, kwargs, 5, "output_padding", 0),
                           _arg(args, kwargs, 6, "groups", 1), _arg(args, kwargs, 7, "dilation", 1))


@_handles("aten.grid_sampler_2d", "aten.grid_sampler")
def _grid_sampler(imp: _Importer, node, args, kwargs):
    """F.grid_sample's 2-d forms: bilinear and nearest, every padding mode; bicubic refused."""
    x, grid, mode, padding, align = args[:5]
    if len(imp.type_of(x).shape) != 4:
        raise GraphError("only 2-d grid sampling (a 4-d input) is supported")
    modes, paddings = {0: "bilinear", 1: "nearest"}, {0: "zeros", 1: "border", 2: "reflection"}
    if int(mode) not in modes:
        raise GraphError("bicubic grid sampling is not supported")
    return imp.emit("grid_sample", [x, imp.cast(grid, imp.type_of(x).dtype)], mode=modes[int(mode)],
                    padding_mode=paddings[int(padding)], align_corners=bool(align))


@_handles("aten.max_pool3d", "aten.max_pool3d_with_indices")
def _max_pool3d(imp: _Importer, node, args, kwargs):
    """A 3-d max pool as two 2-d ones (the largest of a box is the largest over its depth of
    the largest of each plane): every depth plane pooled over height and width, then the
    plane maxima pooled over depth. Indices (positions in the flattened D x H x W volume):
    the first plane holding the box's maximum, and the position within that plane."""
    x = args[0]
    shape = imp.type_of(x).shape
    if len(shape) not in (4, 5):
        raise GraphError(f"input of rank {len(shape)} for a 3-d pool")

    def triple(v: Any, default: Any) -> tuple[int, int, int]:
        v = default if v is None or (isinstance(v, (list, tuple)) and not v) else v
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        return tuple(int(e) for e in (v * 3 if len(v) == 1 else v))  # type: ignore[return-value]

    kernel = triple(args[1], None)
    stride = triple(_arg(args, kwargs, 2, "stride"), kernel)
    padding = triple(_arg(args, kwargs, 3, "padding", 0), 0)
    dilation = triple(_arg(args, kwargs, 4, "dilation", 1), 1)
    ceil = bool(_arg(args, kwargs, 5, "ceil_mode", False))
    n, c, d, h, w = shape if len(shape) == 5 else (1,) + shape
    planes = _reshape_to(imp, x, (n, c * d, h, w))
    plane_attrs = dict(kernel=kernel[1:], stride=stride[1:], padding=padding[1:],
                       dilation=dilation[1:], ceil_mode=ceil)
    plane_max = imp.emit("max_pool2d", [planes], **plane_attrs)
    oh, ow = imp.type_of(plane_max).shape[2:]
    depth_attrs = dict(kernel=(kernel[0], 1), stride=(stride[0], 1), padding=(padding[0], 0),
                       dilation=(dilation[0], 1), ceil_mode=ceil)
    columns = _reshape_to(imp, plane_max, (n, c, d, oh * ow))
    out = imp.emit("max_pool2d", [columns], **depth_attrs)
    od = imp.type_of(out).shape[2]
    values = _reshape_to(imp, out, (n, c, od, oh, ow) if len(shape) == 5 else (c, od, oh, ow))
    if "indices" not in str(node.target):
        return values
    plane_idx = _reshape_to(imp, imp.emit("max_pool2d_indices", [planes], **plane_attrs),
                            (n, c, d, oh * ow))
    depth_idx = imp.emit("max_pool2d_indices", [columns], **depth_attrs)  # = depth * oh*ow + column
    depth = imp.emit("divide_rounded", [depth_idx, imp.scalar(oh * ow, "int64")], mode="floor")
    within = imp.emit("gather_elements", [plane_idx, depth], axis=2)
    flat = imp.emit("add", [imp.emit("mul", [depth, imp.scalar(h * w, "int64")]), within])
    return [values, _reshape_to(imp, flat, imp.type_of(values).shape)]


@_handles("aten.adaptive_avg_pool3d", "aten._adaptive_avg_pool3d")
def _adaptive_avg_pool3d(imp: _Importer, node, args, kwargs):
    """A 3-d adaptive average as two 2-d ones: each depth plane averaged over its height and
    width windows, then those averages over the depth windows (the windows of each axis are
    independent, so the mean of the plane means is the mean of the box)."""
    x, size = args[0], args[1]
    shape = imp.type_of(x).shape
    if len(shape) not in (4, 5):
        raise GraphError(f"input of rank {len(shape)} for a 3-d pool")
    size = list(size) if isinstance(size, (list, tuple)) else [size]
    size = size * 3 if len(size) == 1 else size
    n, c, d, h, w = shape if len(shape) == 5 else (1,) + shape
    od, oh, ow = (dim if s is None else int(s) for s, dim in zip(size, (d, h, w)))
    planes = imp.emit("adaptive_avg_pool2d", [_reshape_to(imp, x, (n, c * d, h, w))], output_size=(oh, ow))
    columns = _reshape_to(imp, planes, (n, c, d, oh * ow))
    out = imp.emit("adaptive_avg_pool2d", [columns], output_size=(od, oh * ow))
    return _reshape_to(imp, out, _out_shape(imp))


# --------------------------------------------------------------------- three spatial axes


def _triple(v: Any, fill: int) -> tuple[int, ...]:
    v = fill if v is None or (isinstance(v, (list, tuple)) and not v) else v
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(int(e) for e in (v * 3 if len(v) == 1 else v))


def _batched5(imp: _Importer, x: Ref) -> Ref:
    shape = imp.type_of(x).shape
    if len(shape) not in (4, 5):
        raise GraphError(f"input of rank {len(shape)} for a 3-d operator")
    return _reshape_to(imp, x, shape if len(shape) == 5 else (1,) + shape)


def _conv3d(imp: _Importer, x: Ref, w: Ref, b: Any, stride: Any, padding: Any, dilation: Any,
            groups: Any) -> Ref:
    """A 3-d convolution as the canonical conv_nd (numpy kernels); padding="same" splits the
    total as PyTorch does, the extra cell at the end."""
    k = imp.type_of(w).shape[2:]
    stride, dilation = _triple(stride, 1), _triple(dilation, 1)
    if isinstance(padding, str):
        totals = [0] * 3 if padding == "valid" else [d * (kk - 1) for d, kk in zip(dilation, k)]
        pads = tuple((t // 2, t - t // 2) for t in totals)
    else:
        pads = tuple((p, p) for p in _triple(padding, 0))
    inputs = [_batched5(imp, x), w] + ([b] if b is not None else [])
    y = imp.emit("conv_nd", inputs, stride=stride, pads=pads, dilation=dilation, groups=int(groups))
    return _reshape_to(imp, y, _out_shape(imp))


@_handles("aten.conv3d")
def _conv3d_h(imp: _Importer, node, args, kwargs):
    return _conv3d(imp, args[0], args[1], _arg(args, kwargs, 2, "bias"), _arg(args, kwargs, 3, "stride", 1),
                   _arg(args, kwargs, 4, "padding", 0), _arg(args, kwargs, 5, "dilation", 1),
                   _arg(args, kwargs, 6, "groups", 1))


@_handles("aten.conv_transpose3d")
def _conv_transpose3d(imp: _Importer, node, args, kwargs):
    """A 3-d transposed convolution as the canonical conv_transpose (numpy kernels)."""
    x, w = args[0], args[1]
    b = _arg(args, kwargs, 2, "bias")
    pads = tuple((p, p) for p in _triple(_arg(args, kwargs, 4, "padding", 0), 0))
    inputs = [_batched5(imp, x), w] + ([b] if b is not None else [])
    y = imp.emit("conv_transpose", inputs, stride=_triple(_arg(args, kwargs, 3, "stride", 1), 1), pads=pads,
                 output_padding=_triple(_arg(args, kwargs, 5, "output_padding", 0), 0),
                 groups=int(_arg(args, kwargs, 6, "groups", 1)),
                 dilation=_triple(_arg(args, kwargs, 7, "dilation", 1), 1))
    return _reshape_to(imp, y, _out_shape(imp))


@_handles("aten.avg_pool3d")
def _avg_pool3d(imp: _Importer, node, args, kwargs):
    """A 3-d average pool as the canonical pool_nd (floor mode, no divisor override)."""
    kernel = _triple(args[1], 1)
    stride = _triple(_arg(args, kwargs, 2, "stride"), 0) if _arg(args, kwargs, 2, "stride") else kernel
    if bool(_arg(args, kwargs, 4, "ceil_mode", False)):
        raise GraphError("3-d average pooling with ceil_mode is not supported")
    if _arg(args, kwargs, 6, "divisor_override") is not None:
        raise GraphError("3-d average pooling with divisor_override is not supported")
    pads = tuple((p, p) for p in _triple(_arg(args, kwargs, 3, "padding", 0), 0))
    y = imp.emit("pool_nd", [_batched5(imp, args[0])], kind="avg", kernel=kernel, stride=stride, pads=pads,
                 dilation=(1, 1, 1), count_include_pad=bool(_arg(args, kwargs, 5, "count_include_pad", True)))
    return _reshape_to(imp, y, _out_shape(imp))
