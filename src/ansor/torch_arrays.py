"""CPU torch tensors to numpy arrays and back, bfloat16 included.

numpy has no bfloat16 of its own (ansor's is `ml_dtypes.bfloat16`), so `Tensor.numpy()` and
`torch.from_numpy` refuse it; the two types have the same bits, so a bfloat16 tensor crosses as
a view of its 16-bit integers, without a copy. torch is never imported here: a tensor is
recognized by its module, and the caller that makes tensors has imported torch already.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def is_torch_tensor(value: Any) -> bool:
    """Whether `value` is a torch tensor (without importing torch)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def tensor_to_numpy(tensor: Any) -> np.ndarray:
    """The values of a torch tensor as a numpy array of the same dtype (bfloat16 as
    ml_dtypes.bfloat16); a CPU tensor is viewed, not copied."""
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":
        import torch

        return tensor.view(torch.int16).numpy().view(_BFLOAT16)
    return tensor.numpy()


def numpy_to_tensor(array: np.ndarray) -> Any:
    """A CPU torch tensor sharing `array`'s memory (a bfloat16 array becomes a torch.bfloat16
    tensor)."""
    import torch

    if array.dtype == _BFLOAT16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
