"""Compiled programs kept on the object that builds them, so a second run compiles nothing.

A kernel's ``init`` used to wrap a fresh closure in ``jax.jit`` on every call; JAX keys
its caches by the function object, so every ``MCMC.run`` traced and compiled the start
again. :func:`call_cached` keeps one jitted function per *static description* (what the
closure captures: the model spec, the move, the capacity, the non-array model
arguments) in ``owner._programs`` and passes the arrays (keys, data, initial values) as
arguments. Nothing is cached when a static part cannot be hashed (then it behaves as a
fresh ``jax.jit``, as before).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import jax
import numpy as np

__all__ = ["call_cached", "split_arrays", "MAX_PROGRAMS"]

#: programs kept per owner and name (least recently used dropped first)
MAX_PROGRAMS = 16


def _is_array(x) -> bool:
    return isinstance(x, (np.ndarray, jax.Array, np.generic))


def split_arrays(tree) -> tuple[Any, list, Callable]:
    """``(static, arrays, merge)``: the hashable description of ``tree`` with its array
    leaves taken out, the array leaves, and ``merge(arrays)`` that rebuilds the tree."""
    leaves, treedef = jax.tree.flatten(tree)
    mask = tuple(_is_array(leaf) for leaf in leaves)
    static_leaves = tuple(None if m else leaf for leaf, m in zip(leaves, mask))
    arrays = [leaf for leaf, m in zip(leaves, mask) if m]

    def merge(arrays):
        it = iter(arrays)
        return treedef.unflatten([next(it) if m else s for m, s in zip(mask, static_leaves)])

    return (treedef, mask, static_leaves), arrays, merge


def call_cached(owner, name: str, static, fn: Callable, *arrays_trees, model_args=(), model_kwargs=None):
    """``jax.jit(fn)(*arrays_trees, model_args, model_kwargs)``, compiled once per ``static``.

    ``fn(*arrays_trees, model_args, model_kwargs)`` must depend on nothing but its
    arguments and ``static`` (a hashable description of what it closes over). The model
    arguments' array leaves are traced; their other leaves (Python numbers, strings,
    objects) are part of the cache key.
    """
    model_kwargs = dict(model_kwargs or {})
    margs_static, margs_arrays, merge = split_arrays((tuple(model_args), model_kwargs))
    key = (name, static, margs_static)
    try:
        hash(key)
    except TypeError:  # an unhashable model argument or setting: compile afresh
        return jax.jit(fn)(*arrays_trees, *(tuple(model_args), model_kwargs))
    programs = owner.__dict__.setdefault("_programs", OrderedDict())
    program = programs.get(key)
    if program is not None:
        programs.move_to_end(key)
    else:

        def program_fn(trees, margs_arrays):
            margs, mkwargs = merge(margs_arrays)
            return fn(*trees, margs, mkwargs)

        program = programs[key] = jax.jit(program_fn)
        while len(programs) > MAX_PROGRAMS:  # the oldest shapes and settings go first
            programs.popitem(last=False)
    return program(arrays_trees, margs_arrays)
