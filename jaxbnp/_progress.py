"""Progress bars: NumPyro's for ``MCMC``, tqdm for jaxbnp's own long loops.

``progress_bar=None`` (the default everywhere in jaxbnp) means *auto*: a bar
is shown when standard error is a terminal and the environment variable
``CI`` is unset, so scripts, notebooks run headless, test suites and CI stay
quiet. ``True`` / ``False`` force it on or off. ``JAXBNP_PROGRESS=0`` (or
``1``) overrides the automatic choice for a whole session.

The bars only report: a run with a bar gives the same draws as one without.

Where standard error is not a terminal (a log file, CI, a pipe), a bar would
be one long line of carriage returns. The CLI prints plain lines there
instead, one every few seconds (:class:`Heartbeat`, a thread: nothing enters
the compiled programs).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

__all__ = ["resolve", "env_choice", "bar", "Heartbeat"]


def resolve(progress_bar: Any) -> bool:
    """Whether to show a bar for a ``progress_bar`` argument (``None`` = auto)."""
    if progress_bar is not None:
        if not isinstance(progress_bar, (bool, int)) or progress_bar not in (0, 1):
            raise ValueError(f"progress_bar must be True, False or None (auto), got {progress_bar!r}.")
        return bool(progress_bar)
    forced = env_choice()
    if forced is not None:
        return forced
    if os.environ.get("CI"):
        return False
    stream = sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def env_choice() -> bool | None:
    """What ``JAXBNP_PROGRESS`` says: ``True`` (on), ``False`` (``0``, ``false``, ``no``,
    ``off`` or empty) or ``None`` when it is unset."""
    forced = os.environ.get("JAXBNP_PROGRESS")
    if forced is None:
        return None
    return forced.strip().lower() not in ("", "0", "false", "no", "off")


def bar(total: int | None, desc: str, enabled: bool, unit: str = "it"):
    """A ``tqdm.auto`` bar (a disabled one, which prints nothing, when not ``enabled``)."""
    from tqdm.auto import tqdm  # a dependency of NumPyro

    return tqdm(total=total, desc=desc, disable=not enabled, unit=unit, leave=False, dynamic_ncols=True)


class Heartbeat:
    """Plain progress lines on standard error, one every ``every_s`` seconds, from a thread.

    Used as a context manager around long work: a line when it starts, then
    every ``every_s`` seconds either ``done/total`` (where the work calls
    :meth:`tick` from the host, e.g. a loop of jitted sweeps) or the time
    elapsed (where the work is one compiled program), and one when it ends. No
    callback enters the compiled program, so the draws and the persistent
    compilation cache are unaffected.
    """

    def __init__(self, desc: str, total: int | None = None, unit: str = "iterations",
                 every_s: float = 5.0, stream: Any = None):
        self.desc, self.unit, self.every_s = desc, unit, float(every_s)
        self.total = None if total is None else max(int(total), 1)
        self.stream = stream
        self.count = 0
        self.t0 = time.perf_counter()
        self._stop = None
        self._thread = None

    def _print(self, text: str) -> None:
        print(f"jaxbnp: {text}", file=self.stream or sys.stderr, flush=True)

    def status(self) -> str:
        elapsed = time.perf_counter() - self.t0
        if self.count and self.total:
            done = min(self.count, self.total)
            return f"{self.desc} {done}/{self.total} {self.unit} ({100 * done // self.total}%), {elapsed:.0f} s"
        return f"{self.desc}: {elapsed:.0f} s elapsed"

    def tick(self, n: int = 1) -> None:
        self.count += int(n)

    def start(self) -> "Heartbeat":
        import threading

        self.t0 = time.perf_counter()
        self._print(self.desc)
        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.wait(self.every_s):
                self._print(self.status())

        self._thread = threading.Thread(target=run, name="jaxbnp-heartbeat", daemon=True)
        self._thread.start()
        return self

    def done(self, ok: bool = True) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
            self._stop = None
            self._print(f"{self.desc} {'done' if ok else 'stopped'} after "
                        f"{time.perf_counter() - self.t0:.1f} s")

    def __enter__(self) -> "Heartbeat":
        return self if self._stop is not None else self.start()

    def __exit__(self, exc_type, *_: Any) -> None:
        self.done(exc_type is None)
