"""BHMC: the nested CRP with multilevel HDP mixtures, fitted by Huang et al.'s
Algorithm 2 (``sampler``)."""

from .sampler import BHMCFit, fit_bhmc

__all__ = ["BHMCFit", "fit_bhmc"]
