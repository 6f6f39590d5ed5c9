"""Dirichlet diffusion trees (docs/mathematics.md §5): within-chain MCMC (``mcmc``),
population MCMC over vmapped chains (``population``), the seed's cut model (``cut``), the
moves they share (``moves``) and the one-call fit (``fit``)."""

from .fit import DDTFit, fit_ddt
from .mcmc import DiffusionTreeMCMC
from .population import PopulationDDT

__all__ = ["DDTFit", "DiffusionTreeMCMC", "PopulationDDT", "fit_ddt"]
