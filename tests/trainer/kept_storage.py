"""Bytes a forward pass leaves alive: what autograd keeps for the backward.

The memory tests of activation recomputation (test_memory_options_accounting.py,
test_trainer_selective_recompute.py) compare what the trainer really keeps with what the
simulator predicts. torch has no CPU allocator statistics, so every storage an operation
creates is recorded (a TorchDispatchMode) and, after the forward and a garbage collection,
the ones still alive and not owned by the model's parameters or buffers are summed.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

T = TypeVar("T")


class _Created(TorchDispatchMode):
    """Weak references to every storage an operation creates while the mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                storage = t.untyped_storage()
                self.storages[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
        return out


def kept_after(forward: Callable[[], T], owned: Iterable[torch.Tensor]) -> tuple[T, int]:
    """`forward()`'s result and the bytes of the storages it created that are still alive
    afterwards, those of `owned` (the parameters and buffers) left out."""
    owned_ptrs = {t.untyped_storage().data_ptr() for t in owned}
    created = _Created()
    with created:
        result = forward()
    gc.collect()
    kept = sum(
        nbytes
        for ptr, (ref, nbytes) in created.storages.items()
        if not ref.expired() and ptr not in owned_ptrs
    )
    return result, kept
