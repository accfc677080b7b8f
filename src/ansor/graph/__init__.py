"""Whole models: a graph IR of canonical operators, importers into it, and executors of it.

`from_torch(module, example_inputs)` and `from_onnx(path_or_model)` import a model; `ansor.tune`
and `ansor.build` take the graph. Importing this package needs only numpy; the importers import
torch or onnx when they are called.
"""

from ansor.graph.onnx_importer import from_onnx
from ansor.graph.torch_importer import UnsupportedOperatorError, from_torch
from ansor.graph.ir import Graph, GraphError, Node
from ansor.graph.ops import OPS, TensorType

__all__ = ["Graph", "GraphError", "Node", "OPS", "TensorType", "UnsupportedOperatorError", "from_onnx",
           "from_torch"]
