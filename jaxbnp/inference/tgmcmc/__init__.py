"""Tree-guided MCMC (Lee & Choi 2015): IBHC trees (``ibhc``), the compiled array
trees and global moves (``device``), the reference host trees (``host``) and the
composable move and NumPyro kernel (``kernel``)."""

from .kernel import TreeGuidedMCMC, tree_guided_moves

__all__ = ["TreeGuidedMCMC", "tree_guided_moves"]
