"""Progress bars: NumPyro's for ``MCMC``, tqdm for jaxbnp's own long loops.

``progress_bar=None`` (the default everywhere in jaxbnp) means *auto*: a bar
is shown when standard error is a terminal and the environment variable
``CI`` is unset, so scripts, notebooks run headless, test suites and CI stay
quiet. ``True`` / ``False`` force it on or off. ``JAXBNP_PROGRESS=0`` (or
``1``) overrides the automatic choice for a whole session.

The bars only report: a run with a bar gives the same draws as one without.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["resolve", "bar"]


def resolve(progress_bar: Any) -> bool:
    """Whether to show a bar for a ``progress_bar`` argument (``None`` = auto)."""
    if progress_bar is not None:
        if not isinstance(progress_bar, (bool, int)) or progress_bar not in (0, 1):
            raise ValueError(f"progress_bar must be True, False or None (auto), got {progress_bar!r}.")
        return bool(progress_bar)
    forced = os.environ.get("JAXBNP_PROGRESS")
    if forced is not None:
        return forced.strip().lower() not in ("", "0", "false", "no", "off")
    if os.environ.get("CI"):
        return False
    stream = sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def bar(total: int | None, desc: str, enabled: bool, unit: str = "it"):
    """A ``tqdm.auto`` bar (a disabled one, which prints nothing, when not ``enabled``)."""
    from tqdm.auto import tqdm  # a dependency of NumPyro

    return tqdm(total=total, desc=desc, disable=not enabled, unit=unit, leave=False, dynamic_ncols=True)
