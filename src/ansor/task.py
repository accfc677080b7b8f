"""Task: one computation (a ComputeDAG) to tune for one Target."""

from __future__ import annotations

import math

from typing import Sequence

import numpy as np

from ansor.dag import ComputeDAG
from ansor.memory import aligned_copy
from ansor.target import Target
from ansor.te.evaluate import evaluate, random_inputs as random_input_arrays
from ansor.te.tensor import Tensor


class Task:
    """One computation to tune for one target: what `tune` searches and `build` compiles.

    Inputs then outputs form the kernel's signature; the target defaults to the host CPU.

    Args:
        tensors: The computation's input tensors (placeholders) then its outputs, in the order
            the kernel takes and returns them.
        target: The hardware to tune for; None for this machine's CPU (`Target.host()`).
        name: A readable name for reports and the kernel's symbol; by default the output
            tensors' names joined by "_".
        spec: How a named workload rebuilds the declaration (set by `ansor.workloads`); stored
            with the records.
    """

    def __init__(self, tensors: Sequence[Tensor], target: Target | None = None, name: str | None = None,
                 spec: dict | None = None):
        self.dag = ComputeDAG(tensors)
        self.target = target or Target.host()
        self.name = name or "_".join(t.name for t in self.dag.outputs)
        self.spec = spec  # how to rebuild the declaration (a named workload), stored with records

    @property
    def workload_key(self) -> str:
        """The computation's canonical key ("wk1-..."): the same for the same computation
        declared with other names, in any process, so records are found again."""
        return self.dag.workload_key

    @property
    def flop(self) -> float:
        """Floating-point operations of one run (index arithmetic excluded), for GFLOP/s."""
        return self.dag.flop

    @property
    def inputs(self) -> list[Tensor]:
        """The input tensors, in the kernel's argument order."""
        return self.dag.inputs

    @property
    def outputs(self) -> list[Tensor]:
        """The output tensors, in the order the kernel returns them."""
        return self.dag.outputs

    @property
    def longest_reduction(self) -> int:
        """The most values any one output element of any stage sums (or maxes) over: a
        sequential float32 sum of n values is off by about sqrt(n) roundings, which the output
        check allows for (`measure.check.reduction_rtol`)."""
        lengths = [math.prod(a.extent for a in t.op.reduce_axes) for t in self.dag.tensors
                   if getattr(t.op, "reduce_axes", None)]
        return max(lengths, default=1)

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Reproducible inputs for measurement and checking, 64-byte aligned like every buffer
        ansor allocates for a kernel."""
        return [aligned_copy(a) for a in random_input_arrays(self.dag.inputs, seed=seed)]

    def reference_outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The outputs computed by numpy from the declaration alone (no schedule involved)."""
        return evaluate(self.dag.outputs, dict(zip(self.dag.inputs, inputs)))

    def describe(self) -> dict:
        """The JSON description stored with the task's records: names and shapes for reports,
        the named-workload spec when there is one, and the whole computation
        (`ComputeDAG.to_data`), so that any process can replay the records without the
        declaration."""
        d = self.dag.describe()
        d["name"] = self.name
        if self.spec is not None:
            d["spec"] = self.spec
        try:
            d["computation"] = self.dag.to_data()
        except ValueError:
            pass  # attrs that are not JSON data: the records replay where the task is declared
        return d

    @property
    def label(self) -> str:
        """The task's name and output shape, for tables and progress: tasks of one model
        often share an output name."""
        return f"{self.name} {'x'.join(map(str, self.outputs[0].shape))}"

    def __repr__(self) -> str:
        return f"Task({self.name!r}, workload={self.workload_key}, target={self.target.key})"
