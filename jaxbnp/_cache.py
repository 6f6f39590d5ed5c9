"""JAX's persistent compilation cache, on by default for the CLI and the estimators.

The first fit of a shape compiles its programs (seconds to tens of seconds on
a CPU); with the cache, a later process that compiles the same programs loads
them from disk instead. :func:`enable_compilation_cache` points JAX at a
per-user folder:

- ``$JAXBNP_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/jaxbnp/jax`` (default
  ``~/.cache/jaxbnp/jax``);
- ``JAXBNP_COMPILATION_CACHE=0`` (or ``false``/``no``/``off``) turns it off,
  as do the CLI's ``--no-compile-cache`` and, for the estimators and fitting
  functions of this process, ``jaxbnp.enable_compilation_cache(False)``;
- a cache folder the user already set (``jax.config.update(
  "jax_compilation_cache_dir", ...)`` or ``JAX_COMPILATION_CACHE_DIR``) is
  left alone.

Cached programs are XLA executables for this machine and JAX version; JAX keys
them by the program, the compiler options and the backend, so a stale entry is
never used. Delete the folder to reclaim the space.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["enable_compilation_cache", "auto_enable", "cache_dir", "cache_disabled_by_env"]

ENV_SWITCH = "JAXBNP_COMPILATION_CACHE"
ENV_DIR = "JAXBNP_CACHE_DIR"
#: programs that compile faster than this are not written (JAX's default is 1 s; the
#: samplers' many mid-sized programs take 0.1 to 1 s each on a CPU)
MIN_COMPILE_SECONDS = 0.1

_enabled_dir: Path | None = None
_user_choice: bool | None = None  # what the user last passed to enable_compilation_cache


def cache_disabled_by_env() -> bool:
    """Whether ``JAXBNP_COMPILATION_CACHE`` turns the cache off."""
    value = os.environ.get(ENV_SWITCH)
    return value is not None and value.strip().lower() in ("0", "false", "no", "off")


def cache_dir() -> Path:
    """The folder the cache uses (``$JAXBNP_CACHE_DIR`` or ``$XDG_CACHE_HOME/jaxbnp/jax``)."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jaxbnp" / "jax"


def _reset_jax_cache() -> None:
    try:  # JAX decides whether to use the cache at its first compilation: decide again
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
    except (ImportError, AttributeError):  # pragma: no cover - an older or newer JAX
        pass


def _enable() -> Path | None:
    global _enabled_dir
    if cache_disabled_by_env():
        return None
    import jax

    own = jax.config.jax_compilation_cache_dir
    if own:  # the user's own folder, or ours from an earlier call
        return Path(own)
    path = cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    _reset_jax_cache()
    _enabled_dir = path
    return path


def enable_compilation_cache(enabled: bool = True) -> Path | None:
    """Turn JAX's persistent compilation cache on in :func:`cache_dir`, or off (module docstring).

    ``enabled=False`` also stops the estimators and fitting functions of this
    process from turning it on, and turns off a cache that jaxbnp turned on
    (a folder the user set in JAX is left alone). Returns the folder in use,
    or ``None`` when the cache is off (``JAXBNP_COMPILATION_CACHE=0`` wins
    over ``enabled=True``; so does a folder that cannot be created).
    """
    global _user_choice, _enabled_dir
    if not isinstance(enabled, bool):
        raise TypeError(f"enable_compilation_cache(enabled): a bool, got {enabled!r}.")
    _user_choice = enabled
    if enabled:
        return _enable()
    if _enabled_dir is not None:
        import jax

        if jax.config.jax_compilation_cache_dir == str(_enabled_dir):
            jax.config.update("jax_compilation_cache_dir", None)
            _reset_jax_cache()
        _enabled_dir = None
    return None


def auto_enable() -> Path | None:
    """What the estimators and fitting functions call: turn the cache on unless the user
    turned it off (``enable_compilation_cache(False)`` or ``JAXBNP_COMPILATION_CACHE=0``)."""
    if _user_choice is False:
        return None
    return _enable()
