"""BHMC: the nested CRP with multilevel HDP mixtures, fitted by Huang et al.'s
Algorithm 2 (``sampler``; docs/mathematics.md §6): the pure ``init``/``step``, the
NumPyro kernel :class:`BHMCKernel` and :func:`fit_bhmc`."""

from .sampler import BHMCFit, BHMCInfo, BHMCKernel, BHMCKernelState, BHMCState, fit_bhmc

__all__ = ["BHMCFit", "BHMCInfo", "BHMCKernel", "BHMCKernelState", "BHMCState", "fit_bhmc"]
