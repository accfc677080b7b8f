"""ONNX models as graphs: the second door into whole-model tuning, beside `from_torch`.

An ONNX file carries its own arithmetic on shapes (Shape -> Gather -> Concat -> Reshape, from
exporters that trace dynamic code). Every node whose inputs are all known at import time (the
weights, Constant nodes, the static shapes of values) is evaluated right here with ONNX's own
reference evaluator, so such chains become constants and only the network's real work reaches
the graph. What remains maps to the canonical operators of `ops.py`; an operator outside the
set is an `UnsupportedOperatorError` naming it and its node, never a silent wrong answer.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

from ansor.graph.torch_importer import UnsupportedOperatorError
from ansor.graph.ir import Graph

__all__ = ["from_onnx"]

Handler = Callable[["_OnnxImporter", Any], None]
_HANDLERS: dict[str, Handler] = {}
#: operator -> the attributes its handler reads; any other attribute on a node is refused by
#: name, so that no attribute is ever silently ignored
_ATTRIBUTES: dict[str, frozenset[str]] = {}

#: element types the compiled kernels compute in (te's); any other (float8, int4, float4, ...)
#: is refused at import
SUPPORTED_DTYPES = ("float32", "float64", "int32", "int64", "bool",
                    "float16", "bfloat16", "int8", "int16", "uint8", "uint16", "uint32", "uint64")


#: operators mapped by their handler even when every input is known: their subgraphs read
#: values of the enclosing graph (graph/onnx_control_flow.py)
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def _handles(*op_types: str, attrs: tuple[str, ...] = ()):
    def deco(fn: Handler) -> Handler:
        for op_type in op_types:
            _HANDLERS[op_type] = fn
            _ATTRIBUTES[op_type] = frozenset(attrs)
        return fn
    return deco


class StaticInputRequired(UnsupportedOperatorError):
    """A graph input decides a shape (a Reshape's shape, a Slice's starts, ...): its value must
    be given at import (`from_onnx(model, inputs={name: value})`) for the graph to be static."""

    def __init__(self, message: str, input_name: str):
        super().__init__(message)
        self.input_name = input_name


def from_onnx(model: Any, inputs: dict[str, Any] | None = None, max_sizes: dict[str, int] | None = None,
              buckets: dict[str, Sequence[int]] | None = None) -> Graph:
    """The graph of an ONNX model (an `onnx.ModelProto` or the path of a .onnx file) with
    static input shapes.

    `inputs` gives values for graph inputs that decide shapes (a Reshape's target shape, a
    Slice's starts, an Expand's shape, ...): they become constants of the graph, which then
    serves exactly those values. Without them, such an input is a `StaticInputRequired` error
    naming it. An input with no elements (a shape with a 0) carries nothing but its type: it is
    known at import and is not an input of the graph. Every operator, attribute, output and
    element type the importer does not run exactly as ONNX defines it is an
    `UnsupportedOperatorError` naming it.

    `max_sizes` {dim_param: maximum} serves inputs with symbolic dimensions: the result is a
    `graph.dynamic.DynamicGraph` (one static import per bucket; `buckets` overrides the sizes)."""
    import onnx

    if max_sizes:
        from ansor.graph.dynamic import from_onnx_dynamic

        return from_onnx_dynamic(model, max_sizes, inputs, buckets)

    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            model = onnx.load(path)
        except Exception as exc:  # protobuf's DecodeError and friends: not an ONNX file
            raise ValueError(f"{path}: not an ONNX model ({type(exc).__name__}: {exc})") from None
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"from_onnx takes an onnx.ModelProto or a path, got {type(model).__name__}")
    model = onnx.shape_inference.infer_shapes(model)
    from ansor.graph.qdq_fusion import fuse_qdq

    model = fuse_qdq(model).model  # QDQ layers as integer ones, each checked (graph/qdq_fusion.py)
    return _OnnxImporter(model, inputs or {}).run()


class _OnnxImporter:
    def __init__(self, model: Any, inputs: dict[str, Any]):
        from onnx import numpy_helper

        self.model = model
        self.graph = Graph()
        self.known: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t)
                                             for t in model.graph.initializer}
        declared = {vi.name for vi in model.graph.input}
        unknown = sorted(set(inputs) - declared)
        if unknown:
            raise ValueError(f"from_onnx: inputs= names {', '.join(unknown)}, which the model does not have "
                             f"(its inputs: {', '.join(sorted(declared - set(self.known)))})")
        self.known.update({name: np.asarray(value) for name, value in inputs.items()})
        self.values: dict[str, str] = {}    # ONNX value name -> graph value or constant name
        self._expansions = 0                 # function bodies expanded so far (unique prefixes)
        self.empty_inputs: list[str] = []    # inputs without elements: known, not graph inputs
        self.producers: dict[str, list[str]] = {}  # graph value -> the ONNX values it was computed from
        self.opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=13)

    # ------------------------------------------------------------------------ the walk
    def run(self) -> Graph:
        from onnx import helper

        for vi in self.model.graph.input:
            if vi.name in self.known:
                continue  # an initializer listed as an input (older exporters), or given in inputs=
            if not vi.type.HasField("tensor_type"):
                raise UnsupportedOperatorError(f"input {vi.name!r} is not a tensor "
                                               f"({vi.type.WhichOneof('value')}); ansor runs tensors only")
            t = vi.type.tensor_type
            shape = [d.dim_value for d in t.shape.dim]
            if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
                dims = [d.dim_param or "?" if not d.HasField("dim_value") else d.dim_value for d in t.shape.dim]
                raise UnsupportedOperatorError(f"input {vi.name!r} has a dynamic shape {dims}; ansor compiles "
                                               f"for static shapes: export with fixed sizes")
            dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)))
            if dtype not in SUPPORTED_DTYPES:
                raise UnsupportedOperatorError(f"input {vi.name!r} has element type {dtype}; ansor computes in "
                                               f"{', '.join(SUPPORTED_DTYPES)}")
            if 0 in shape:  # no elements: its value is known, and what reads it is folded at import
                self.empty_inputs.append(vi.name)
                self.known[vi.name] = np.empty(shape, dtype)
                continue
            self.values[vi.name] = self.graph.add_input(_safe(vi.name), shape, dtype)
        for node in self.model.graph.node:
            self._import_node(node)
        for out in self.model.graph.output:
            if not out.type.HasField("tensor_type"):
                raise UnsupportedOperatorError(f"output {out.name!r} is not a tensor "
                                               f"({out.type.WhichOneof('value')}); ansor runs tensors only")
            if out.name in self.known:
                name = self.graph.add_constant(self.known[out.name])
                shape = self.known[out.name].shape
                self.values[out.name] = self.graph.add_node("reshape", [name], {"shape": shape})
            self.graph.outputs.append(self.values[out.name])
        self.graph.validate()
        return self.graph

    def _import_node(self, node: Any) -> None:
        """One node: folded when its inputs are known, mapped by its handler, else expanded
        into its ONNX function body (the operators the standard defines by others), else
        refused by name."""
        if node.domain not in ("", "ai.onnx") and not (node.domain == "com.microsoft"
                                                      and node.op_type in MICROSOFT_OPERATORS):
            self._unsupported(node, f"operator domain {node.domain!r}")
        if node.op_type == "Shape" and node.input[0] in self.values:
            self.known[node.output[0]] = self._static_shape(node)
        elif node.op_type not in _CONTROL_FLOW and all(not name or name in self.known for name in node.input):
            self._evaluate(node)
        elif node.op_type in _HANDLERS:
            self._check_attributes(node)
            _HANDLERS[node.op_type](self, node)
            missing = [o for o in node.output if o and o not in self.values and o not in self.known]
            if missing:
                self._unsupported(node, f"output {missing[0]!r} (only the first output is computed) of")
            for o in node.output:
                if o in self.values:
                    self.producers.setdefault(o, [i for i in node.input if i])
                    out = self.graph.type_of(self.values[o])
                    self._check_dtype(node, out.dtype)
                    if 0 in out.shape:
                        self._unsupported(node, f"empty result (shape {list(out.shape)}) of")
        elif not self._expand(node):
            self._unsupported(node, "operator")

    def _expand(self, node: Any) -> bool:
        """Import `node` as the nodes of its ONNX function body (the standard's own definition
        of e.g. Softplus, Mish, CastLike, RMSNormalization, Attention by other operators), each
        imported in turn under the function's opset; False when the operator has none."""
        from ansor.graph.onnx_control_flow import rename_in_node

        found = self._function_body(node)
        if found is None:
            return False
        body, schema = found
        self._expansions += 1
        prefix = f"{node.name or node.op_type}#{self._expansions}/"
        rename = {formal: actual for formal, actual in zip(body.input, list(node.input) + [""] * len(body.input))}
        rename.update(zip(body.output, node.output))
        given = {name: a.default_value for name, a in schema.attributes.items()
                 if a.default_value.type != 0}  # the operator's defaults, then what the node sets
        given.update({a.name: a for a in node.attribute})
        saved = self.opset
        self.opset = next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")), self.opset)
        try:
            for inner in body.node:
                copy = type(inner)()
                copy.CopyFrom(inner)
                copy.name = prefix + (inner.name or inner.op_type)
                # the body's names (in its subgraphs too) are the function's own: renamed alike
                rename_in_node(copy, lambda name: rename.get(name, prefix + name))
                kept = []
                for a in copy.attribute:
                    if a.ref_attr_name:
                        if a.ref_attr_name not in given:
                            continue  # an optional attribute with no default, left unset
                        value = type(a)()
                        value.CopyFrom(given[a.ref_attr_name])
                        value.name = a.name
                        kept.append(value)
                    else:
                        kept.append(a)
                del copy.attribute[:]
                copy.attribute.extend(kept)
                self._import_node(copy)
        finally:
            self.opset = saved
        return True

    def _function_body(self, node: Any) -> Any:
        """The FunctionProto defining `node`'s operator at this opset, with the operator's
        schema, or None."""
        import onnx
        from onnx import defs, helper

        try:
            schema = defs.get_schema(node.op_type, self.opset, node.domain or "")
        except Exception:  # an operator unknown to this onnx: no body to expand
            return None
        body = onnx.FunctionProto()
        if schema.has_function:
            versions = sorted(schema.function_opset_versions)
            version = max([v for v in versions if v <= self.opset] or versions[:1])
            body.ParseFromString(schema.get_function_with_opset_version(version))
            return body, schema
        if schema.has_context_dependent_function:
            versions = sorted(schema.context_dependent_function_opset_versions)
            version = max([v for v in versions if v <= self.opset] or versions[:1])
            types = []
            for name in node.input:
                if not name:
                    types.append(onnx.TypeProto().SerializeToString())
                    continue
                elem = helper.np_dtype_to_tensor_dtype(np.dtype(self.dtype(name)))
                types.append(helper.make_tensor_type_proto(elem, list(self.shape(name))).SerializeToString())
            try:
                data = schema.get_context_dependent_function_with_opset_version(
                    version, node.SerializeToString(), types)
            except Exception:
                return None
            if not data:
                return None
            body.ParseFromString(data)
            return body, schema
        return None

    def _check_attributes(self, node: Any) -> None:
        """Refuse a node carrying an attribute its handler does not read: ignoring it would
        compute something other than what the model says."""
        handled = _ATTRIBUTES.get(node.op_type, frozenset())
        for a in node.attribute:
            if a.name not in handled:
                self._unsupported(node, f"attribute {a.name!r} of")

    def _check_dtype(self, node: Any, dtype: str) -> None:
        if dtype not in SUPPORTED_DTYPES:
            self._unsupported(node, f"element type {dtype} of")

    def _unsupported(self, node: Any, what: str) -> None:
        raise UnsupportedOperatorError(f"unsupported ONNX {what} {node.op_type!r} at node {node.name!r} "
                                       f"(inputs {list(node.input)})")

    def _evaluate(self, node: Any) -> None:
        """A node whose inputs are all known: computed now, its outputs known."""
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        inputs = [i for i in node.input if i]
        declared = [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(self.known[i].dtype),
                                                  self.known[i].shape) for i in inputs]
        graph = helper.make_graph([node], "fold", declared,
                                  [helper.make_empty_tensor_value_info(o) for o in node.output if o])
        opsets = [o for o in self.model.opset_import if o.domain not in ("", "ai.onnx")]
        # the reference evaluator implements (De)QuantizeLinear from opset 19, whose integer
        # arithmetic is that of the earlier versions
        opset = max(self.opset, 19) if node.op_type in ("QuantizeLinear", "DequantizeLinear") else self.opset
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *opsets])
        try:
            results = ReferenceEvaluator(model).run(None, {i: self.known[i] for i in inputs})
        except Exception as exc:  # e.g. an If whose branches read values of the outer graph
            raise UnsupportedOperatorError(f"ONNX {node.op_type} node {node.name!r}: cannot be evaluated at "
                                           f"import ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})") from None
        for name, value in zip([o for o in node.output if o], results):
            if not isinstance(value, (np.ndarray, np.generic)):  # a sequence, an optional or a map
                self._unsupported(node, f"{type(value).__name__} result (ansor runs tensors only) of")
            self.known[name] = np.asarray(value)

    def _static_shape(self, node: Any) -> np.ndarray:
        shape = np.array(self.graph.type_of(self.values[node.input[0]]).shape, dtype=np.int64)
        start = _attr(node, "start", 0)
        end = _attr(node, "end", None)
        return shape[start:end]

    # ------------------------------------------------------------------------ helpers
    def value(self, name: str) -> str:
        """The graph name of an ONNX value; known arrays become constants on first use."""
        if name not in self.values:
            if name not in self.known:
                raise UnsupportedOperatorError(f"value {name!r} is used before it is defined")
            array = self.known[name]
            if str(array.dtype) not in SUPPORTED_DTYPES:
                raise UnsupportedOperatorError(f"value {name!r} has element type {array.dtype}; ansor computes "
                                               f"in {', '.join(SUPPORTED_DTYPES)}")
            self.values[name] = self.graph.add_constant(array)
        return self.values[name]

    def const(self, name: str, what: str, node: Any) -> np.ndarray:
        """An input that must be known at import time (a shape, axes, a pad amount)."""
        if name not in self.known:
            if any(vi.name == name for vi in self.model.graph.input):
                raise StaticInputRequired(f"ONNX {node.op_type} node {node.name!r}: its {what} is the graph "
                                          f"input {name!r}; give its value at import: "
                                          f"from_onnx(model, inputs={{{name!r}: ...}})", name)
            source = self._graph_input_behind(name)
            if source is not None:
                raise StaticInputRequired(f"ONNX {node.op_type} node {node.name!r}: its {what} ({name!r}) is "
                                          f"computed from the graph input {source!r}; give its value at import: "
                                          f"from_onnx(model, inputs={{{source!r}: ...}})", source)
            raise UnsupportedOperatorError(f"ONNX {node.op_type} node {node.name!r}: its {what} "
                                           f"({name!r}) is computed at run time; ansor needs it static")
        return self.known[name]

    def _graph_input_behind(self, name: str) -> str | None:
        """The first graph input that the value `name` is computed from, if any: giving its
        value at import may make `name` known."""
        inputs = {vi.name for vi in self.model.graph.input}
        seen, todo = set(), [name]
        while todo:
            current = todo.pop(0)
            if current in seen:
                continue
            seen.add(current)
            if current in inputs and current not in self.known:
                return current
            todo.extend(self.producers.get(current, []))
        return None

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.known:
            return tuple(self.known[name].shape)
        return self.graph.type_of(self.value(name)).shape

    def dtype(self, name: str) -> str:
        if name in self.known:
            return str(self.known[name].dtype)
        return self.graph.type_of(self.value(name)).dtype

    def emit(self, node: Any, op: str, inputs: list[str], out: int = 0, **attrs: Any) -> str:
        name = self.graph.add_node(op, inputs, attrs, source=f"ONNX {node.op_type} {node.name!r}")
        if out is not None:
            self.values[node.output[out]] = name
        return name

    def scalar(self, value: float, dtype: str) -> str:
        return self.graph.add_constant(np.array(value, dtype=dtype))


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "input"


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


# ---------------------------------------------------------------------------- elementwise
_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
          "Neg": "neg", "Abs": "abs", "Erf": "erf", "HardSwish": "hardswish", "Sin": "sin", "Cos": "cos",
          "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh",
          "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "Floor": "floor", "Ceil": "ceil",
          "Round": "round", "Sign": "sign"}
#: unary operators defined on floats only (ONNX's type constraint; the graph's kernels agree)
_FLOAT_ONLY = {"sigmoid", "tanh", "exp", "log", "sqrt", "erf", "hardswish", "sin", "cos", "tan", "asin",
               "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "floor", "ceil", "round"}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "maximum",
           "Min": "minimum", "Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt",
           "GreaterOrEqual": "ge", "And": "logical_and", "Or": "logical_or", "Sum": "add",
           "Xor": "logical_xor"}


@_handles(*_UNARY)
def _unary(imp: _OnnxImporter, node: Any) -> None:
    op = _UNARY[node.op_type]
    dtype = imp.dtype(node.input[0])
    if op in _FLOAT_ONLY and dtype not in ("float32", "float64"):
        imp._unsupported(node, f"{dtype} input of")
    imp.emit(node, op, [imp.value(node.input[0])])


@_handles(*_BINARY, attrs=("broadcast", "axis"))
def _binary(imp: _OnnxImporter, node: Any) -> None:
    if node.op_type in ("Max", "Min", "Sum") and len(node.input) != 2:
        _variadic(imp, node)
        return
    a, b = node.input
    dtype = imp.dtype(a) if a in imp.values or a not in imp.known else imp.dtype(b)
    imp._check_dtype(node, dtype)
    if node.op_type == "Div" and dtype in ("int32", "int64"):
        imp.emit(node, "trunc_div", [_operand(imp, node, name, dtype) for name in (a, b)])
        return
    if node.op_type == "Div" and dtype.startswith(("int", "uint")):
        if dtype == "uint64":
            imp._unsupported(node, "uint64 operands (past int64's range) of")
        # narrower integers divide exactly in int64 (no quotient leaves the type's range but
        # INT_MIN / -1, which wraps back as ONNX's reference does)
        wide = [imp.graph.add_node("cast", [_operand(imp, node, name, dtype)], {"dtype": "int64"})
                for name in (a, b)]
        quotient = imp.graph.add_node("trunc_div", wide, {}, source=f"ONNX Div {node.name!r}")
        imp.emit(node, "cast", [quotient], dtype=dtype)
        return
    if node.op_type == "Pow" and dtype not in ("float32", "float64"):
        imp._unsupported(node, f"{dtype} base of")
    left, right = (_operand(imp, node, name, dtype) for name in (a, b))
    imp.emit(node, _BINARY[node.op_type], [left, _legacy_broadcast(imp, node, a, b, right)])


def _legacy_broadcast(imp: _OnnxImporter, node: Any, a: str, b: str, right: str) -> str:
    """Before opset 7, `broadcast=1, axis=k` laid B's axes along A's from axis k (numpy aligns
    them at the end): B gets trailing axes of one so that numpy's rule means the same."""
    if _attr(node, "axis", None) is None:
        return right
    if not _attr(node, "broadcast", 0):
        imp._unsupported(node, "axis without broadcast of")
    rank_a, shape_b = len(imp.shape(a)), imp.shape(b)
    axis = int(_attr(node, "axis", 0)) % max(rank_a, 1)
    trailing = rank_a - axis - len(shape_b)
    if trailing < 0:
        imp._unsupported(node, f"broadcast of rank {len(shape_b)} at axis {axis} of")
    if trailing == 0:
        return right
    return imp.graph.add_node("reshape", [right], {"shape": tuple(shape_b) + (1,) * trailing})


def _operand(imp: _OnnxImporter, node: Any, name: str, dtype: str) -> str:
    """An input of an elementwise node in the node's element type: a known array (a scalar
    constant) is converted when the conversion keeps its values (an exponent 2 for a float
    base), and refused when it would not."""
    if name not in imp.known or name in imp.values:
        return imp.value(name)
    array = imp.known[name]
    if str(array.dtype) != dtype:
        if array.dtype == object or not np.array_equal(array.astype(dtype).astype(array.dtype), array):
            imp._unsupported(node, f"operand {name!r} of type {array.dtype} (not exactly {dtype}) of")
        array = array.astype(dtype)
    return imp.graph.add_constant(array)


def _variadic(imp: _OnnxImporter, node: Any) -> None:
    """Max, Min and Sum of one or of three and more inputs: a chain of the binary operator."""
    names = [n for n in node.input if n]
    dtype = next((imp.dtype(n) for n in names if n not in imp.known), imp.dtype(names[0]))
    imp._check_dtype(node, dtype)
    acc = _operand(imp, node, names[0], dtype)
    for name in names[1:]:
        acc = imp.graph.add_node(_BINARY[node.op_type], [acc, _operand(imp, node, name, dtype)],
                                 source=f"ONNX {node.op_type} {node.name!r}")
    imp.values[node.output[0]] = acc


@_handles("Not")
def _not(imp: _OnnxImporter, node: Any) -> None:
    imp.emit(node, "logical_not", [imp.value(node.input[0])])


@_handles("Reciprocal")
def _reciprocal(imp: _OnnxImporter, node: Any) -> None:
    x = imp.value(node.input[0])
    imp.emit(node, "div", [imp.scalar(1.0, imp.dtype(node.input[0])), x])


@_handles("Identity")
def _identity(imp: _OnnxImporter, node: Any) -> None:
    imp.values[node.output[0]] = imp.value(node.input[0])


@_handles("Dropout", attrs=("seed", "is_test", "ratio"))
def _dropout(imp: _OnnxImporter, node: Any) -> None:
    """Inference: the identity. Training mode (its third input true, or the attribute of old
    opsets) draws a random mask, which no compiler reproduces: refused."""
    training = len(node.input) > 2 and node.input[2]
    if training and bool(np.asarray(imp.const(node.input[2], "training_mode", node)).item()):
        imp._unsupported(node, "training mode of")
    if imp.opset < 7 and not _attr(node, "is_test", 0):
        imp._unsupported(node, "training mode (is_test=0) of")
    imp.values[node.output[0]] = imp.value(node.input[0])
    if len(node.output) > 1 and node.output[1]:  # the mask of inference: every element kept
        if imp.opset < 12:
            imp._unsupported(node, "float mask output of opsets before 12 of")
        imp.known[node.output[1]] = np.ones(imp.shape(node.input[0]), dtype=bool)


@_handles("Cast", attrs=("to", "saturate"))
def _cast(imp: _OnnxImporter, node: Any) -> None:
    from onnx import helper

    dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(_attr(node, "to", 1))))
    imp._check_dtype(node, dtype)
    x = imp.value(node.input[0])
    if imp.graph.type_of(x).dtype == dtype:
        imp.values[node.output[0]] = x
    else:
        imp.emit(node, "cast", [x], dtype=dtype)


@_handles("Clip", attrs=("min", "max"))
def _clip(imp: _OnnxImporter, node: Any) -> None:
    names = (list(node.input[1:3]) + ["", ""])[:2]
    bounds = [float(imp.const(n, "bound", node)) if n else None for n in names]
    lo = _attr(node, "min", bounds[0]) if imp.opset < 11 else bounds[0]
    hi = _attr(node, "max", bounds[1]) if imp.opset < 11 else bounds[1]
    imp.emit(node, "clamp", [imp.value(node.input[0])], min=lo, max=hi)


@_handles("HardSigmoid", attrs=("alpha", "beta"))
def _hardsigmoid(imp: _OnnxImporter, node: Any) -> None:
    alpha, beta = _attr(node, "alpha", 0.2), _attr(node, "beta", 0.5)
    x = imp.value(node.input[0])
    if abs(alpha - 1 / 6) < 1e-6 and abs(beta - 0.5) < 1e-6:
        imp.emit(node, "hardsigmoid", [x])
        return
    dtype = imp.dtype(node.input[0])
    scaled = imp.graph.add_node("mul", [x, imp.scalar(alpha, dtype)])
    shifted = imp.graph.add_node("add", [scaled, imp.scalar(beta, dtype)])
    imp.emit(node, "clamp", [shifted], min=0.0, max=1.0)


@_handles("Gelu", attrs=("approximate",))
def _gelu(imp: _OnnxImporter, node: Any) -> None:
    imp.emit(node, "gelu", [imp.value(node.input[0])], approximate=_text(_attr(node, "approximate", "none")))


@_handles("Where")
def _where(imp: _OnnxImporter, node: Any) -> None:
    cond, a, b = node.input
    dtype = imp.dtype(a) if a not in imp.known else imp.dtype(b)
    imp._check_dtype(node, dtype)
    imp.emit(node, "where", [imp.value(cond)] + [_operand(imp, node, n, dtype) for n in (a, b)])


# ---------------------------------------------------------------------------- dense
@_handles("Conv", attrs=("auto_pad", "pads", "strides", "dilations", "group", "kernel_shape"))
def _conv(imp: _OnnxImporter, node: Any) -> None:
    """2-d convolutions; a 1-d one is the 2-d one over an image of height 1."""
    if _text(_attr(node, "auto_pad", "NOTSET")) != "NOTSET":
        imp._unsupported(node, "auto_pad of")
    w_shape = imp.shape(node.input[1])
    if len(w_shape) not in (3, 4):
        _spatial_node(imp, node, "conv_nd", len(w_shape) - 2)
        return
    kernel = _attr(node, "kernel_shape", None)
    if kernel is not None and tuple(kernel) != tuple(w_shape[2:]):
        imp._unsupported(node, f"kernel_shape {list(kernel)} unlike the weight's {list(w_shape[2:])} of")
    one_d = len(w_shape) == 3
    pads = list(_attr(node, "pads", [0] * (2 * (len(w_shape) - 2))))
    strides = list(_attr(node, "strides", [1] * (len(w_shape) - 2)))
    dilations = list(_attr(node, "dilations", [1] * (len(w_shape) - 2)))
    x, w = imp.value(node.input[0]), imp.value(node.input[1])
    if one_d:
        n, c, length = imp.shape(node.input[0])
        x = imp.graph.add_node("reshape", [x], {"shape": (n, c, 1, length)})
        w = imp.graph.add_node("reshape", [w], {"shape": (w_shape[0], w_shape[1], 1, w_shape[2])})
        pads, strides, dilations = [0, pads[0], 0, pads[1]], [1, *strides], [1, *dilations]
    if pads[0] != pads[2] or pads[1] != pads[3]:  # asymmetric: pad first, then convolve
        x = imp.graph.add_node("pad", [x], {"pads": ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3]))})
        pads = [0, 0, 0, 0]
    bias = [imp.value(node.input[2])] if len(node.input) > 2 and node.input[2] else []
    out = imp.graph.add_node("conv2d", [x, w, *bias], {
        "stride": tuple(strides), "padding": (pads[0], pads[1]), "dilation": tuple(dilations),
        "groups": int(_attr(node, "group", 1))}, source=f"ONNX Conv {node.name!r}")
    if one_d:
        n_, o, _, l_out = imp.graph.type_of(out).shape
        out = imp.graph.add_node("reshape", [out], {"shape": (n_, o, l_out)})
    imp.values[node.output[0]] = out


@_handles("MatMul")
def _matmul(imp: _OnnxImporter, node: Any) -> None:
    imp.emit(node, "matmul", [imp.value(node.input[0]), imp.value(node.input[1])])


@_handles("Gemm", attrs=("alpha", "beta", "transA", "transB", "broadcast"))
def _gemm(imp: _OnnxImporter, node: Any) -> None:
    a, b = node.input[0], node.input[1]
    alpha, beta = float(_attr(node, "alpha", 1.0)), float(_attr(node, "beta", 1.0))
    x = imp.value(a)
    if _attr(node, "transA", 0):
        x = imp.graph.add_node("permute", [x], {"axes": (1, 0)})
    has_c = len(node.input) > 2 and node.input[2]
    one_d_bias = not has_c or len(imp.shape(node.input[2])) == 1
    if _attr(node, "transB", 0) and alpha == 1.0 and beta == 1.0 and one_d_bias:  # x @ W^T + c: a linear layer
        inputs = [x, imp.value(b)] + ([imp.value(node.input[2])] if has_c else [])
        imp.emit(node, "linear", inputs)
        return
    w = imp.value(b)
    if _attr(node, "transB", 0):
        w = imp.graph.add_node("permute", [w], {"axes": (1, 0)})
    out = imp.graph.add_node("matmul", [x, w])
    dtype = imp.graph.type_of(out).dtype
    if alpha != 1.0:
        out = imp.graph.add_node("mul", [out, imp.scalar(alpha, dtype)])
    if has_c:
        c = imp.value(node.input[2])
        if beta != 1.0:
            c = imp.graph.add_node("mul", [c, imp.scalar(beta, dtype)])
        out = imp.graph.add_node("add", [out, c])
    imp.values[node.output[0]] = out


@_handles("Gather", attrs=("axis",))
def _gather(imp: _OnnxImporter, node: Any) -> None:
    data, indices = node.input
    axis = int(_attr(node, "axis", 0))
    if data in imp.known and indices not in imp.known and axis == 0 and imp.known[data].ndim == 2:
        imp.emit(node, "embedding", [imp.value(data), imp.value(indices)])
        return
    if indices in imp.known and imp.known[indices].ndim == 0:  # x[..., i, ...]: a slice, axis dropped
        shape = imp.shape(data)
        axis %= len(shape)
        i = int(imp.known[indices])
        if not -shape[axis] <= i < shape[axis]:
            raise IndexError(f"ONNX Gather node {node.name!r}: index {i} is out of range for an axis of "
                             f"{shape[axis]}")
        i %= shape[axis]
        part = imp.graph.add_node("slice", [imp.value(data)], {"axis": axis, "start": i, "end": i + 1, "step": 1})
        imp.emit(node, "reshape", [part], shape=shape[:axis] + shape[axis + 1:])
        return
    rank = len(imp.shape(data))
    if not -rank <= axis < rank:
        imp._unsupported(node, f"axis {axis} for rank {rank} of")
    imp.emit(node, "take", [imp.value(data), imp.value(indices)], axis=axis % rank)


@_handles("IsNaN")
def _is_nan(imp: _OnnxImporter, node: Any) -> None:
    x = imp.value(node.input[0])
    imp.emit(node, "ne", [x, x])  # NaN is the one value unequal to itself


@_handles("GatherND", attrs=("batch_dims",))
def _gather_nd(imp: _OnnxImporter, node: Any) -> None:
    """data[indices[..., 0], indices[..., 1], ...]: numpy's advanced indexing of the leading
    axes (the graph's `index` op), one index tensor per entry of the indices' last axis."""
    data, indices = node.input
    if int(_attr(node, "batch_dims", 0)) != 0:
        imp._unsupported(node, "form of")
    shape = imp.shape(indices)
    k = shape[-1]
    parts = []
    for j in range(k):
        if indices in imp.known:
            parts.append(imp.graph.add_constant(np.ascontiguousarray(imp.known[indices][..., j])))
            continue
        part = imp.graph.add_node("slice", [imp.value(indices)],
                                  {"axis": len(shape) - 1, "start": j, "end": j + 1, "step": 1})
        parts.append(imp.graph.add_node("reshape", [part], {"shape": tuple(shape[:-1])}))
    imp.emit(node, "index", [imp.value(data), *parts])


# ---------------------------------------------------------------------------- normalization
@_handles("BatchNormalization", attrs=("epsilon", "momentum", "training_mode", "spatial", "is_test",
                                       "consumed_inputs"))
def _batch_norm(imp: _OnnxImporter, node: Any) -> None:
    if _attr(node, "training_mode", 0) or (imp.opset < 7 and not _attr(node, "is_test", 0)):
        imp._unsupported(node, "training mode of")
    if not _attr(node, "spatial", 1):
        imp._unsupported(node, "spatial=0 of")
    x, scale, bias, mean, var = node.input[:5]
    imp.emit(node, "batch_norm", [imp.value(x), imp.value(mean), imp.value(var), imp.value(scale), imp.value(bias)],
             eps=float(_attr(node, "epsilon", 1e-5)))


@_handles("LayerNormalization", attrs=("axis", "epsilon", "stash_type"))
def _layer_norm(imp: _OnnxImporter, node: Any) -> None:
    if any(node.output[1:]):  # the mean and inverse deviation too: the standard's own expansion
        if not imp._expand(node):
            imp._unsupported(node, "mean and inverse-deviation outputs of")
        return
    rank = len(imp.shape(node.input[0]))
    axis = int(_attr(node, "axis", -1)) % rank
    inputs = [imp.value(n) for n in node.input if n]
    imp.emit(node, "layer_norm", inputs, normalized_ndim=rank - axis, eps=float(_attr(node, "epsilon", 1e-5)))


@_handles("Softmax", "LogSoftmax", attrs=("axis",))
def _softmax(imp: _OnnxImporter, node: Any) -> None:
    rank = len(imp.shape(node.input[0]))
    axis = int(_attr(node, "axis", -1 if imp.opset >= 13 else 1)) % rank
    if imp.opset < 13 and axis != rank - 1:
        imp._unsupported(node, "pre-13 softmax over flattened axes of")
    imp.emit(node, "softmax" if node.op_type == "Softmax" else "log_softmax", [imp.value(node.input[0])], axis=axis)


@_handles("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
          attrs=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce(imp: _OnnxImporter, node: Any) -> None:
    rank = len(imp.shape(node.input[0]))
    if len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in imp.const(node.input[1], "axes", node)]
    else:
        axes = list(_attr(node, "axes", []))
    if not axes:
        if _attr(node, "noop_with_empty_axes", 0):
            imp.values[node.output[0]] = imp.value(node.input[0])
            return
        axes = list(range(rank))
    op = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min",
          "ReduceProd": "prod"}[node.op_type]
    imp.emit(node, op, [imp.value(node.input[0])], axes=tuple(sorted(a % rank for a in axes)),
             keepdims=bool(_attr(node, "keepdims", 1)))


# ---------------------------------------------------------------------------- pooling
def _pool_attrs(node: Any) -> dict[str, Any]:
    if _text(_attr(node, "auto_pad", "NOTSET")) != "NOTSET":
        raise UnsupportedOperatorError(f"ONNX {node.op_type} node {node.name!r}: auto_pad is not supported")
    kernel = tuple(_attr(node, "kernel_shape", [1, 1]))
    if len(kernel) != 2:
        raise UnsupportedOperatorError(f"ONNX {node.op_type} node {node.name!r}: {len(kernel)}-d pooling "
                                       f"(ansor pools 2-d)")
    pads = list(_attr(node, "pads", [0, 0, 0, 0]))
    if pads[0] != pads[2] or pads[1] != pads[3]:
        raise UnsupportedOperatorError(f"ONNX {node.op_type} node {node.name!r}: asymmetric pads {pads}")
    return {"kernel": kernel, "stride": tuple(_attr(node, "strides", [1, 1])), "padding": (pads[0], pads[1]),
            "ceil_mode": bool(_attr(node, "ceil_mode", 0))}


@_handles("MaxPool", attrs=("auto_pad", "pads", "kernel_shape", "strides", "ceil_mode", "dilations", "storage_order"))
def _max_pool(imp: _OnnxImporter, node: Any) -> None:
    rank = len(_attr(node, "kernel_shape", [1, 1]))
    _pool(imp, node, "max_pool2d", {"dilation": tuple(_attr(node, "dilations", [1] * rank))})


@_handles("AveragePool", attrs=("auto_pad", "pads", "kernel_shape", "strides", "ceil_mode", "count_include_pad",
                                "dilations"))
def _avg_pool(imp: _OnnxImporter, node: Any) -> None:
    _pool(imp, node, "avg_pool2d", {"count_include_pad": bool(_attr(node, "count_include_pad", 0))})


def _pool(imp: _OnnxImporter, node: Any, op: str, extra: dict[str, Any]) -> None:
    """2-d pooling; a 1-d one pools an image of height 1 (a window of height 1, no padding);
    3-d pools and dilated average pools run as numpy kernels (`pool_nd`)."""
    x = imp.value(node.input[0])
    shape = imp.shape(node.input[0])
    dilated_average = op == "avg_pool2d" and any(d != 1 for d in _attr(node, "dilations", []))
    if len(shape) > 4 or dilated_average:
        _spatial_node(imp, node, "pool_nd", len(shape) - 2, kind="max" if op == "max_pool2d" else "avg")
        return
    if len(shape) != 3:
        imp.emit(node, op, [x], **extra, **_pool_attrs(node))
        return
    kernel = list(_attr(node, "kernel_shape", [1]))
    pads = list(_attr(node, "pads", [0, 0]))
    if len(kernel) != 1 or pads[0] != pads[1]:
        imp._unsupported(node, f"kernel {kernel} with pads {pads} of")
    if _text(_attr(node, "auto_pad", "NOTSET")) != "NOTSET":
        imp._unsupported(node, "auto_pad of")
    attrs = {"kernel": (1, kernel[0]), "stride": (1, *_attr(node, "strides", [1])), "padding": (0, pads[0]),
             "ceil_mode": bool(_attr(node, "ceil_mode", 0)), **extra}
    if "dilation" in attrs:
        attrs["dilation"] = (1, *attrs["dilation"])
    flat = imp.graph.add_node("reshape", [x], {"shape": (shape[0], shape[1], 1, shape[2])})
    out = imp.graph.add_node(op, [flat], attrs, source=f"ONNX {node.op_type} {node.name!r}")
    n, c, _, length = imp.graph.type_of(out).shape
    imp.emit(node, "reshape", [out], shape=(n, c, length))


@_handles("GlobalAveragePool")
def _global_avg_pool(imp: _OnnxImporter, node: Any) -> None:
    imp.emit(node, "adaptive_avg_pool2d", [imp.value(node.input[0])], output_size=(1, 1))


# ---------------------------------------------------------------------------- layout
@_handles("Reshape", attrs=("allowzero",))
def _reshape(imp: _OnnxImporter, node: Any) -> None:
    shape = imp.shape(node.input[0])
    target = [int(d) for d in imp.const(node.input[1], "shape", node)]
    if not _attr(node, "allowzero", 0):
        target = [shape[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1]))
        target[target.index(-1)] = int(np.prod(shape)) // max(known, 1)
    imp.emit(node, "reshape", [imp.value(node.input[0])], shape=tuple(target))


@_handles("Flatten", attrs=("axis",))
def _flatten(imp: _OnnxImporter, node: Any) -> None:
    shape = imp.shape(node.input[0])
    axis = int(_attr(node, "axis", 1))
    if not -len(shape) <= axis <= len(shape):
        imp._unsupported(node, f"axis {axis} out of range for rank {len(shape)} of")
    axis = axis + len(shape) if axis < 0 else axis  # a negative axis counts from the end
    imp.emit(node, "reshape", [imp.value(node.input[0])],
             shape=(int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))))


@_handles("Squeeze", "Unsqueeze", attrs=("axes",))
def _squeeze(imp: _OnnxImporter, node: Any) -> None:
    shape = list(imp.shape(node.input[0]))
    if len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in imp.const(node.input[1], "axes", node)]
    else:
        axes = list(_attr(node, "axes", []))
    if node.op_type == "Squeeze":
        axes = [a % len(shape) for a in axes] or [i for i, d in enumerate(shape) if d == 1]
        target = [d for i, d in enumerate(shape) if i not in axes]
    else:
        rank = len(shape) + len(axes)
        target = shape
        for a in sorted(a % rank for a in axes):
            target.insert(a, 1)
    imp.emit(node, "reshape", [imp.value(node.input[0])], shape=tuple(target))


@_handles("Transpose", attrs=("perm",))
def _transpose(imp: _OnnxImporter, node: Any) -> None:
    rank = len(imp.shape(node.input[0]))
    perm = _attr(node, "perm", list(reversed(range(rank))))
    imp.emit(node, "permute", [imp.value(node.input[0])], axes=tuple(int(p) for p in perm))


@_handles("Concat", attrs=("axis",))
def _concat(imp: _OnnxImporter, node: Any) -> None:
    rank = len(imp.shape(node.input[0]))
    parts = [n for n in node.input if not (n in imp.known and imp.known[n].size == 0)]  # empty parts add nothing
    if not parts:
        imp._unsupported(node, "all-empty inputs of")
    if len(parts) == 1:
        imp.values[node.output[0]] = imp.value(parts[0])
        return
    imp.emit(node, "concat", [imp.value(n) for n in parts], axis=int(_attr(node, "axis", 0)) % rank)


@_handles("Slice")
def _slice(imp: _OnnxImporter, node: Any) -> None:
    if imp.opset < 10:
        imp._unsupported(node, "opset-9 form (starts and ends as attributes) of")
    shape = imp.shape(node.input[0])
    starts = imp.const(node.input[1], "starts", node)
    ends = imp.const(node.input[2], "ends", node)
    axes = imp.const(node.input[3], "axes", node) if len(node.input) > 3 and node.input[3] else range(len(starts))
    steps = imp.const(node.input[4], "steps", node) if len(node.input) > 4 and node.input[4] else [1] * len(starts)
    x = imp.value(node.input[0])
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = int(axis) % len(shape)
        begin, stop, stride = slice(int(start), int(end), int(step)).indices(shape[axis])
        if (begin, stop, stride) != (0, shape[axis], 1):
            x = imp.graph.add_node("slice", [x], {"axis": axis, "start": begin, "end": stop, "step": stride})
    imp.values[node.output[0]] = x


@_handles("Expand")
def _expand(imp: _OnnxImporter, node: Any) -> None:
    shape = imp.shape(node.input[0])
    target = tuple(int(d) for d in imp.const(node.input[1], "shape", node))
    out = tuple(np.broadcast_shapes(shape, target))
    x = imp.value(node.input[0])
    if out == shape:
        imp.values[node.output[0]] = x
    else:
        imp.emit(node, "expand", [x], shape=out)


@_handles("Pad", attrs=("mode", "pads", "value"))
def _pad(imp: _OnnxImporter, node: Any) -> None:
    mode = _text(_attr(node, "mode", "constant"))
    if mode not in ("constant", "reflect", "edge", "wrap"):
        imp._unsupported(node, f"mode {mode!r} of")
    rank = len(imp.shape(node.input[0]))
    pads = [int(p) for p in (imp.const(node.input[1], "pads", node) if imp.opset >= 11 else _attr(node, "pads", []))]
    value = float(_attr(node, "value", 0.0)) if imp.opset < 11 else 0.0
    if imp.opset >= 11 and len(node.input) > 2 and node.input[2]:
        given = np.asarray(imp.const(node.input[2], "pad value", node))
        if given.size != 1:
            imp._unsupported(node, f"pad value of {given.size} elements of")
        value = float(given.reshape(-1)[0])
    axes = list(range(rank))
    if len(node.input) > 3 and node.input[3]:
        axes = [int(a) % rank for a in imp.const(node.input[3], "axes", node)]
    if len(pads) != 2 * len(axes):
        imp._unsupported(node, f"{len(pads)} pads for {len(axes)} axes of")
    pairs = [(0, 0)] * rank
    for j, a in enumerate(axes):
        pairs[a] = (pads[j], pads[j + len(axes)])
    shape = imp.shape(node.input[0])
    x = imp.value(node.input[0])
    if any(lo < 0 or hi < 0 for lo, hi in pairs):  # a negative pad crops: slice first
        for a, (lo, hi) in enumerate(pairs):
            if lo < 0 or hi < 0:
                start, end = max(0, -lo), shape[a] - max(0, -hi)
                if end <= start:
                    imp._unsupported(node, f"pads that crop axis {a} to nothing of")
                x = imp.graph.add_node("slice", [x], {"axis": a, "start": start, "end": end, "step": 1})
        pairs = [(max(0, lo), max(0, hi)) for lo, hi in pairs]
    if mode != "constant":
        small = [d for d, (lo, hi) in zip(imp.graph.type_of(x).shape, pairs) if mode == "reflect" and max(lo, hi) >= d]
        if small:
            imp._unsupported(node, "reflect padding wider than its axis of")
        imp.emit(node, "pad_border", [x], pads=tuple(pairs), mode=mode)
        return
    imp.emit(node, "pad", [x], pads=tuple(pairs), value=value)


@_handles("Split", attrs=("axis", "split", "num_outputs"))
def _split(imp: _OnnxImporter, node: Any) -> None:
    """Each output a slice along `axis`: sizes from the `split` input (opset 13) or attribute,
    else `num_outputs` parts of ceil(n / parts) (the last smaller), else equal parts."""
    shape = imp.shape(node.input[0])
    axis = int(_attr(node, "axis", 0))
    if not -len(shape) <= axis < len(shape):
        imp._unsupported(node, f"axis {axis} out of range for rank {len(shape)} of")
    axis %= len(shape)
    n, outputs = shape[axis], [o for o in node.output]
    if len(node.input) > 1 and node.input[1]:
        sizes = [int(v) for v in imp.const(node.input[1], "split sizes", node)]
    elif _attr(node, "split", None) is not None:
        sizes = [int(v) for v in _attr(node, "split", None)]
    elif _attr(node, "num_outputs", None) is not None:
        parts = int(_attr(node, "num_outputs", None))
        step = -(-n // parts)
        sizes = [min(step, n - i * step) for i in range(parts)]
    else:
        if n % len(outputs):
            imp._unsupported(node, f"uneven split of {n} into {len(outputs)} of")
        sizes = [n // len(outputs)] * len(outputs)
    if len(sizes) != len(outputs) or sum(sizes) != n or min(sizes) < 0:
        imp._unsupported(node, f"split sizes {sizes} of an axis of {n} into {len(outputs)} outputs of")
    x, start = imp.value(node.input[0]), 0
    for out, size in zip(outputs, sizes):
        if out and size == 0:  # an empty part holds nothing: known, and dropped where it is joined
            imp.known[out] = np.empty(shape[:axis] + (0,) + shape[axis + 1:], imp.dtype(node.input[0]))
        elif out:
            imp.values[out] = imp.graph.add_node("slice", [x], {"axis": axis, "start": start, "end": start + size,
                                                                "step": 1}, source=f"ONNX Split {node.name!r}")
        start += size


@_handles("Tile")
def _tile(imp: _OnnxImporter, node: Any) -> None:
    """np.tile: each axis of extent d repeated r times is the axis pair (r, d) expanded from
    (1, d), then joined."""
    shape = imp.shape(node.input[0])
    repeats = [int(r) for r in imp.const(node.input[1], "repeats", node)]
    if len(repeats) != len(shape) or min(repeats, default=1) < 1:
        imp._unsupported(node, f"repeats {repeats} for a rank-{len(shape)} input of")
    x = imp.value(node.input[0])
    if all(r == 1 for r in repeats):
        imp.values[node.output[0]] = x
        return
    paired = imp.graph.add_node("reshape", [x], {"shape": tuple(v for d in shape for v in (1, d))})
    wide = imp.graph.add_node("expand", [paired], {"shape": tuple(v for d, r in zip(shape, repeats) for v in (r, d))})
    imp.emit(node, "reshape", [wide], shape=tuple(d * r for d, r in zip(shape, repeats)))


@_handles("Trilu", attrs=("upper",))
def _trilu(imp: _OnnxImporter, node: Any) -> None:
    """The upper (or lower) triangle of the last two axes from diagonal k: a constant mask
    known at import (the shape is static), applied with `where`."""
    shape = imp.shape(node.input[0])
    if len(shape) < 2:
        imp._unsupported(node, f"rank-{len(shape)} input of")
    k = int(np.asarray(imp.const(node.input[1], "diagonal", node)).reshape(-1)[0]) \
        if len(node.input) > 1 and node.input[1] else 0
    rows, cols = shape[-2:]
    mask = np.triu(np.ones((rows, cols), bool), k) if _attr(node, "upper", 1) else np.tril(np.ones((rows, cols), bool), k)
    dtype = imp.dtype(node.input[0])
    imp.emit(node, "where", [imp.graph.add_constant(mask), imp.value(node.input[0]),
                             imp.graph.add_constant(np.zeros((), dtype))])


# ---------------------------------------------------------------------------- indexing and scans
@_handles("Mod", attrs=("fmod",))
def _mod_op(imp: _OnnxImporter, node: Any) -> None:
    a, b = node.input
    dtype = imp.dtype(a) if a not in imp.known else imp.dtype(b)
    imp._check_dtype(node, dtype)
    fmod = bool(_attr(node, "fmod", 0))
    if dtype.startswith("float") and not fmod:
        imp._unsupported(node, "fmod=0 on floats (undefined in ONNX) of")
    imp.emit(node, "mod", [_operand(imp, node, n, dtype) for n in (a, b)], fmod=fmod)


@_handles("ArgMax", "ArgMin", attrs=("axis", "keepdims", "select_last_index"))
def _arg_reduce(imp: _OnnxImporter, node: Any) -> None:
    rank = len(imp.shape(node.input[0]))
    axis = int(_attr(node, "axis", 0))
    if not -rank <= axis < rank:
        imp._unsupported(node, f"axis {axis} for rank {rank} of")
    imp.emit(node, "arg_reduce", [imp.value(node.input[0])], axis=axis % rank,
             keepdims=bool(_attr(node, "keepdims", 1)), select_last_index=bool(_attr(node, "select_last_index", 0)),
             largest=node.op_type == "ArgMax")


@_handles("GatherElements", attrs=("axis",))
def _gather_elements(imp: _OnnxImporter, node: Any) -> None:
    rank = len(imp.shape(node.input[0]))
    axis = int(_attr(node, "axis", 0))
    if not -rank <= axis < rank:
        imp._unsupported(node, f"axis {axis} for rank {rank} of")
    imp.emit(node, "gather_elements", [imp.value(node.input[0]), imp.value(node.input[1])], axis=axis % rank)


@_handles("ScatterElements", "Scatter", attrs=("axis", "reduction"))
def _scatter_elements(imp: _OnnxImporter, node: Any) -> None:
    rank = len(imp.shape(node.input[0]))
    axis = int(_attr(node, "axis", 0))
    if not -rank <= axis < rank:
        imp._unsupported(node, f"axis {axis} for rank {rank} of")
    reduction = _text(_attr(node, "reduction", "none"))
    if reduction not in ("none", "add", "mul", "max", "min"):
        imp._unsupported(node, f"reduction {reduction!r} of")
    dtype = imp.dtype(node.input[0])
    imp.emit(node, "scatter_elements", [imp.value(node.input[0]), imp.value(node.input[1]),
                                         _operand(imp, node, node.input[2], dtype)],
             axis=axis % rank, reduction=reduction)


@_handles("ScatterND", attrs=("reduction",))
def _scatter_nd(imp: _OnnxImporter, node: Any) -> None:
    reduction = _text(_attr(node, "reduction", "none"))
    if reduction not in ("none", "add", "mul", "max", "min"):
        imp._unsupported(node, f"reduction {reduction!r} of")
    dtype = imp.dtype(node.input[0])
    imp.emit(node, "scatter_nd", [imp.value(node.input[0]), imp.value(node.input[1]),
                                   _operand(imp, node, node.input[2], dtype)], reduction=reduction)


@_handles("CumSum", attrs=("exclusive", "reverse"))
def _cumsum(imp: _OnnxImporter, node: Any) -> None:
    rank = len(imp.shape(node.input[0]))
    axis = int(np.asarray(imp.const(node.input[1], "axis", node)).reshape(-1)[0])
    if not -rank <= axis < rank:
        imp._unsupported(node, f"axis {axis} for rank {rank} of")
    imp.emit(node, "cumsum", [imp.value(node.input[0])], axis=axis % rank,
             exclusive=bool(_attr(node, "exclusive", 0)), reverse=bool(_attr(node, "reverse", 0)))


@_handles("TopK", attrs=("axis", "largest", "sorted"))
def _topk(imp: _OnnxImporter, node: Any) -> None:
    """Values and indices as two graph values (each operator has one output)."""
    shape = imp.shape(node.input[0])
    axis = int(_attr(node, "axis", -1))
    if not -len(shape) <= axis < len(shape):
        imp._unsupported(node, f"axis {axis} for rank {len(shape)} of")
    if imp.opset < 10:
        imp._unsupported(node, "opset-1 form (k as an attribute) of")
    k = int(np.asarray(imp.const(node.input[1], "k", node)).reshape(-1)[0])
    if not _attr(node, "sorted", 1):
        imp._unsupported(node, "unsorted form of")
    attrs = {"k": k, "axis": axis % len(shape), "largest": bool(_attr(node, "largest", 1))}
    x = imp.value(node.input[0])
    for position, indices in ((0, False), (1, True)):
        if len(node.output) > position and node.output[position]:
            imp.values[node.output[position]] = imp.graph.add_node(
                "topk", [x], {**attrs, "indices": indices}, source=f"ONNX TopK {node.name!r}")


@_handles("IsInf", attrs=("detect_positive", "detect_negative"))
def _is_inf(imp: _OnnxImporter, node: Any) -> None:
    dtype = imp.dtype(node.input[0])
    if dtype not in ("float32", "float64"):
        imp._unsupported(node, f"{dtype} input of")
    x = imp.value(node.input[0])
    tests = []
    if _attr(node, "detect_positive", 1):
        tests.append(imp.graph.add_node("eq", [x, imp.scalar(np.inf, dtype)]))
    if _attr(node, "detect_negative", 1):
        tests.append(imp.graph.add_node("eq", [x, imp.scalar(-np.inf, dtype)]))
    if not tests:
        imp.emit(node, "ne", [x, x])  # nothing detected: false everywhere... except NaN, so:
        imp.values[node.output[0]] = imp.graph.add_node("logical_and", [imp.values[node.output[0]],
                                                                        imp.graph.add_node("eq", [x, x])])
        return
    imp.values[node.output[0]] = tests[0] if len(tests) == 1 else imp.graph.add_node("logical_or", tests)


@_handles("Size")
def _size(imp: _OnnxImporter, node: Any) -> None:
    imp.known[node.output[0]] = np.array(int(np.prod(imp.shape(node.input[0]))), dtype=np.int64)


@_handles("Mean")
def _mean_of_inputs(imp: _OnnxImporter, node: Any) -> None:
    names = [n for n in node.input if n]
    dtype = next((imp.dtype(n) for n in names if n not in imp.known), imp.dtype(names[0]))
    if dtype not in ("float32", "float64"):
        imp._unsupported(node, f"{dtype} inputs of")
    total = _operand(imp, node, names[0], dtype)
    for name in names[1:]:
        total = imp.graph.add_node("add", [total, _operand(imp, node, name, dtype)])
    imp.emit(node, "div", [total, imp.scalar(len(names), dtype)])


@_handles("GlobalMaxPool")
def _global_max_pool(imp: _OnnxImporter, node: Any) -> None:
    rank = len(imp.shape(node.input[0]))
    imp.emit(node, "max", [imp.value(node.input[0])], axes=tuple(range(2, rank)), keepdims=True)


@_handles("Resize", attrs=("mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
                           "exclude_outside", "extrapolation_value", "antialias", "axes",
                           "keep_aspect_ratio_policy"))
def _resize(imp: _OnnxImporter, node: Any) -> None:
    """ONNX Resize with sizes or scales known at import (see graph/resize.py)."""
    from ansor.graph.resize import COORDINATE_MODES, NEAREST_MODES

    shape = imp.shape(node.input[0])
    if imp.opset < 11:
        imp._unsupported(node, "opset-10 form of")
    mode = _text(_attr(node, "mode", "nearest"))
    transform = _text(_attr(node, "coordinate_transformation_mode", "half_pixel"))
    nearest = _text(_attr(node, "nearest_mode", "round_prefer_floor"))
    if mode not in ("nearest", "linear", "cubic"):
        imp._unsupported(node, f"mode {mode!r} of")
    if transform not in COORDINATE_MODES:
        imp._unsupported(node, f"coordinate_transformation_mode {transform!r} of")
    if mode == "nearest" and nearest not in NEAREST_MODES:
        imp._unsupported(node, f"nearest_mode {nearest!r} of")
    if _attr(node, "antialias", 0):
        imp._unsupported(node, "antialias of")
    if _text(_attr(node, "keep_aspect_ratio_policy", "stretch")) != "stretch":
        imp._unsupported(node, "keep_aspect_ratio_policy other than stretch of")
    axes = [int(a) % len(shape) for a in _attr(node, "axes", range(len(shape)))]
    scales_in = node.input[2] if len(node.input) > 2 else ""
    sizes_in = node.input[3] if len(node.input) > 3 else ""
    sizes, scales = list(shape), [1.0] * len(shape)
    if sizes_in:
        given = [int(v) for v in imp.const(sizes_in, "sizes", node)]
        for a, v in zip(axes, given):
            sizes[a], scales[a] = v, v / shape[a]
        scales = []  # ONNX: with sizes, each axis's scale is output / input
    elif scales_in:
        given = [float(v) for v in imp.const(scales_in, "scales", node)]
        if not given:
            imp._unsupported(node, "empty scales and no sizes of")
        for a, v in zip(axes, given):
            scales[a], sizes[a] = v, int(np.floor(shape[a] * v))
    else:
        imp._unsupported(node, "form without scales or sizes of")
    imp.emit(node, "resize", [imp.value(node.input[0])], sizes=tuple(sizes), scales=tuple(scales), mode=mode,
             coordinate_transformation_mode=transform, nearest_mode=nearest,
             cubic_coeff_a=float(_attr(node, "cubic_coeff_a", -0.75)),
             exclude_outside=bool(_attr(node, "exclude_outside", 0)))


@_handles("LeakyRelu", attrs=("alpha",))
def _leaky_relu(imp: _OnnxImporter, node: Any) -> None:
    x, dtype = imp.value(node.input[0]), imp.dtype(node.input[0])
    negative = imp.graph.add_node("lt", [x, imp.scalar(0, dtype)])
    scaled = imp.graph.add_node("mul", [x, imp.scalar(float(_attr(node, "alpha", 0.01)), dtype)])
    imp.emit(node, "where", [negative, scaled, x])


@_handles("PRelu")
def _prelu(imp: _OnnxImporter, node: Any) -> None:
    """x where x >= 0, slope * x below; a 1-d slope of the channel count is per channel."""
    x, dtype = imp.value(node.input[0]), imp.dtype(node.input[0])
    shape, slope_shape = imp.shape(node.input[0]), imp.shape(node.input[1])
    slope = _operand(imp, node, node.input[1], dtype)
    if len(shape) > 2 and len(slope_shape) == 1 and slope_shape[0] == shape[1] != shape[-1]:
        slope = imp.graph.add_node("reshape", [slope], {"shape": (shape[1],) + (1,) * (len(shape) - 2)})
    negative = imp.graph.add_node("lt", [x, imp.scalar(0, dtype)])
    imp.emit(node, "where", [negative, imp.graph.add_node("mul", [x, slope]), x])


@_handles("InstanceNormalization", attrs=("epsilon",))
def _instance_norm(imp: _OnnxImporter, node: Any) -> None:
    """(x - mean) / sqrt(var + eps) * scale + bias, statistics over each (n, c)'s spatial axes."""
    shape, dtype = imp.shape(node.input[0]), imp.dtype(node.input[0])
    axes = tuple(range(2, len(shape)))
    per_channel = (shape[1],) + (1,) * (len(shape) - 2)
    x = imp.value(node.input[0])
    mean = imp.graph.add_node("mean", [x], {"axes": axes, "keepdims": True})
    centered = imp.graph.add_node("sub", [x, mean])
    var = imp.graph.add_node("mean", [imp.graph.add_node("mul", [centered, centered])], {"axes": axes, "keepdims": True})
    eps = imp.scalar(float(_attr(node, "epsilon", 1e-5)), dtype)
    normed = imp.graph.add_node("mul", [centered, imp.graph.add_node("rsqrt", [imp.graph.add_node("add", [var, eps])])])
    scale = imp.graph.add_node("reshape", [imp.value(node.input[1])], {"shape": per_channel})
    bias = imp.graph.add_node("reshape", [imp.value(node.input[2])], {"shape": per_channel})
    imp.emit(node, "add", [imp.graph.add_node("mul", [normed, scale]), bias])


def _spatial_node(imp: _OnnxImporter, node: Any, op: str, rank: int, kind: str = "max") -> None:
    """A convolution, transposed convolution or pool of any spatial rank, as the numpy kernels
    of `graph.spatial` run it (floor mode, explicit pads only)."""
    if _text(_attr(node, "auto_pad", "NOTSET")) != "NOTSET":
        imp._unsupported(node, "auto_pad of")
    if _attr(node, "ceil_mode", 0):
        imp._unsupported(node, f"ceil_mode of a {rank}-d")
    pads = list(_attr(node, "pads", [0] * (2 * rank)))
    attrs: dict[str, Any] = {"stride": tuple(_attr(node, "strides", [1] * rank)),
                             "pads": tuple((pads[i], pads[i + rank]) for i in range(rank)),
                             "dilation": tuple(_attr(node, "dilations", [1] * rank))}
    inputs = [imp.value(node.input[0])]
    if op == "pool_nd":
        attrs.update(kind=kind, kernel=tuple(_attr(node, "kernel_shape", [1] * rank)),
                     count_include_pad=bool(_attr(node, "count_include_pad", 0)), p=int(_attr(node, "p", 2)))
    else:
        kernel = _attr(node, "kernel_shape", None)
        if kernel is not None and tuple(kernel) != tuple(imp.shape(node.input[1])[2:]):
            imp._unsupported(node, f"kernel_shape {list(kernel)} unlike the weight's of")
        inputs += [imp.value(n) for n in node.input[1:] if n]
        attrs["groups"] = int(_attr(node, "group", 1))
        if op == "conv_transpose":
            attrs["output_padding"] = tuple(_attr(node, "output_padding", [0] * rank))
    imp.emit(node, op, inputs, **attrs)


@_handles("ConvTranspose", attrs=("auto_pad", "pads", "strides", "dilations", "group", "kernel_shape",
                                  "output_padding"))
def _conv_transpose(imp: _OnnxImporter, node: Any) -> None:
    """Transposed convolutions of any spatial rank (numpy kernels; `output_shape` is refused)."""
    _spatial_node(imp, node, "conv_transpose", len(imp.shape(node.input[1])) - 2)


@_handles("LpPool", attrs=("auto_pad", "pads", "kernel_shape", "strides", "ceil_mode", "dilations", "p"))
def _lp_pool(imp: _OnnxImporter, node: Any) -> None:
    _spatial_node(imp, node, "pool_nd", len(imp.shape(node.input[0])) - 2, kind="lp")


@_handles("Hardmax", attrs=("axis",))
def _hardmax(imp: _OnnxImporter, node: Any) -> None:
    """1 at the first largest element along `axis`, 0 elsewhere: the arg max compared with
    the positions of the axis (a constant)."""
    shape, dtype = imp.shape(node.input[0]), imp.dtype(node.input[0])
    axis = int(_attr(node, "axis", -1))
    if imp.opset < 13 or not -len(shape) <= axis < len(shape):
        imp._unsupported(node, f"axis {axis} (or the opset-11 flattening form) of")
    axis %= len(shape)
    best = imp.graph.add_node("arg_reduce", [imp.value(node.input[0])],
                              {"axis": axis, "keepdims": True, "select_last_index": False, "largest": True})
    positions = np.arange(shape[axis], dtype=np.int64).reshape((-1,) + (1,) * (len(shape) - axis - 1))
    hit = imp.graph.add_node("eq", [best, imp.graph.add_constant(positions)])
    imp.emit(node, "cast", [hit], dtype=dtype)


@_handles("LpNormalization", attrs=("axis", "p"))
def _lp_normalization(imp: _OnnxImporter, node: Any) -> None:
    """x / ||x||_p along `axis` (p 1 or 2); 0 where the norm is 0."""
    shape = imp.shape(node.input[0])
    axis, p = int(_attr(node, "axis", -1)) % len(shape), int(_attr(node, "p", 2))
    if p not in (1, 2):
        imp._unsupported(node, f"p={p} of")
    x = imp.value(node.input[0])
    mag = imp.graph.add_node("abs", [x]) if p == 1 else imp.graph.add_node("mul", [x, x])
    total = imp.graph.add_node("sum", [mag], {"axes": (axis,), "keepdims": True})
    norm = total if p == 1 else imp.graph.add_node("sqrt", [total])
    dtype = imp.dtype(node.input[0])
    zero = imp.scalar(0, dtype)
    # a zero vector stays zero (ONNX's definition), where x / 0 would be nan
    imp.emit(node, "where", [imp.graph.add_node("eq", [norm, zero]), zero, imp.graph.add_node("div", [x, norm])])


@_handles("OneHot", attrs=("axis",))
def _one_hot(imp: _OnnxImporter, node: Any) -> None:
    """values[1] where the (wrapped) index equals the position along the new axis, values[0]
    elsewhere; depth and values known at import."""
    indices, depth_name, values_name = node.input
    depth = int(np.asarray(imp.const(depth_name, "depth", node)).reshape(-1)[0])
    values = np.asarray(imp.const(values_name, "values", node)).reshape(-1)
    shape = imp.shape(indices)
    rank = len(shape) + 1
    axis = int(_attr(node, "axis", -1))
    if depth <= 0 or values.size != 2 or not -rank <= axis < rank:
        imp._unsupported(node, f"depth {depth}, {values.size} values or axis {axis} of")
    axis %= rank
    idx_dtype = imp.dtype(indices)
    if idx_dtype not in ("int32", "int64", "float32", "float64"):
        imp._unsupported(node, f"{idx_dtype} indices of")
    ids = imp.value(indices)
    if idx_dtype.startswith("float"):  # ONNX casts non-integer indices to integers (toward zero)
        ids = imp.graph.add_node("cast", [ids], {"dtype": "int64"})
        idx_dtype = "int64"
    wrapped = imp.graph.add_node("where", [imp.graph.add_node("lt", [ids, imp.scalar(0, idx_dtype)]),
                                           imp.graph.add_node("add", [ids, imp.scalar(depth, idx_dtype)]), ids])
    expanded = imp.graph.add_node("reshape", [wrapped], {"shape": shape[:axis] + (1,) + shape[axis:]})
    positions = np.arange(depth, dtype=idx_dtype).reshape((-1,) + (1,) * (rank - axis - 1))
    hit = imp.graph.add_node("eq", [expanded, imp.graph.add_constant(positions)])
    dtype = str(values.dtype)
    imp._check_dtype(node, dtype)
    imp.emit(node, "where", [hit, imp.graph.add_constant(values[1:2].reshape(())),
                             imp.graph.add_constant(values[0:1].reshape(()))])


# converter groups in modules of their own register themselves with `_handles` on import
from ansor.graph import onnx_control_flow  # noqa: E402,F401
from ansor.graph import onnx_shape_constants  # noqa: E402,F401
from ansor.graph import onnx_sampling  # noqa: E402,F401
from ansor.graph import onnx_padding_forms  # noqa: E402,F401
from ansor.graph import onnx_recurrent  # noqa: E402,F401
from ansor.graph import onnx_types  # noqa: E402,F401
from ansor.graph import onnx_operand_forms  # noqa: E402,F401
from ansor.graph import onnx_small_operators  # noqa: E402,F401
from ansor.graph.onnx_quantized import MICROSOFT_OPERATORS  # noqa: E402
