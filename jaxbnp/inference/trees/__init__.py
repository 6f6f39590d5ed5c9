"""Dirichlet diffusion trees: within-chain MCMC (``mcmc``) and population MCMC
over vmapped chains (``population``)."""

from .mcmc import DDTFit, DiffusionTreeMCMC, fit_ddt
from .population import PopulationDDT

__all__ = ["DDTFit", "DiffusionTreeMCMC", "PopulationDDT", "fit_ddt"]
