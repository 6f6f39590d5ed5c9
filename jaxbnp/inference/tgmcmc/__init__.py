"""Tree-guided MCMC (Lee & Choi 2015): IBHC trees (``ibhc``), the compiled array
trees and global moves (``device``) and the NumPyro kernel (``kernel``)."""

from .kernel import TreeGuidedMCMC

__all__ = ["TreeGuidedMCMC"]
