"""Calling a user's function from the loader's threads: whether it takes a ``generator``, and a
``StopIteration`` out of it made an error (one place for the per-image hook and the batch transform).

Example:
    >>> takes_generator(lambda image, generator=None: image), takes_generator(abs)
    (True, False)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

__all__ = ["stop_iteration_as_error", "takes_generator"]


def takes_generator(function: Callable) -> bool:
    """Whether ``function`` (or a module's ``forward``; what ``torch.compile`` wrapped) has a ``generator``
    argument."""
    signed = getattr(function, "_orig_mod", function)  # torch.compile's wrapper takes (*args, **kwargs)
    signed = signed.forward if isinstance(signed, torch.nn.Module) else signed  # a module's __call__ hides it
    try:
        return "generator" in inspect.signature(signed).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


class stop_iteration_as_error:  # noqa: N801 (used as a context manager, as contextlib's)
    """A ``StopIteration`` out of the user's ``where`` as a ``RuntimeError``: raised from the loader's
    ``__next__`` it would end the user's epoch early without a word (as PEP 479 does for generators). A class,
    not ``contextlib.contextmanager``, which gives back the StopIteration of a RuntimeError caused by it."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> None:
        if isinstance(error, StopIteration):
            raise RuntimeError(
                f"the loader's {self.where} raised StopIteration (a next() on an exhausted iterator?); it would "
                "have ended the epoch early: catch it in your function"
            ) from error
