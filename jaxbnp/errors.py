"""The library's own exceptions and warnings, defined once (the lowest layer: any
module may import them)."""

__all__ = ["CapacityError", "SingleClusterWarning"]


class CapacityError(RuntimeError):
    """Raised when a sampler needs more cluster slots than its capacity."""


class SingleClusterWarning(UserWarning):
    """MAP-DP ended with every point (``n > 1``) in one cluster."""
