"""Whole models: a graph IR of canonical operators, importers into it, and executors of it.

Importing this package needs only numpy; the PyTorch importer imports torch when it is called.
"""

from ansor.graph.ir import Graph, GraphError, Node
from ansor.graph.ops import OPS, TensorType

__all__ = ["Graph", "GraphError", "Node", "OPS", "TensorType"]
