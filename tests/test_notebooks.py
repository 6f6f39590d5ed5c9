"""Every notebook in notebooks/ runs top to bottom (code cells executed in order, SMALL sizes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = json.loads(path.read_text())["cells"]
    namespace: dict = {"__name__": "__main__"}
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        exec(compile(source, f"{path.name}[cell {i}]", "exec"), namespace)  # noqa: S102
    plt.close("all")
    assert namespace.get("SMALL") is True
    CHECKS.get(path.name, lambda ns: None)(namespace)


def _check_quickstart(ns):
    # the Gibbs draws recover most of the 13 ring clusters (NMI 0.86 at seed 0)
    assert ns["nmi"] > 0.7
    assert 5 <= len(set(ns["best"].tolist())) <= 20


def _check_mapdp(ns):
    # at 20 points per cluster the MAP partition merges neighbouring ring clusters: MAPDP()
    # finds 5 (NMI 0.75) with an NLL 157 nats below the truth's; at 100 per cluster it finds the 13
    assert ns["est"].n_clusters_ >= 4 and ns["nmi"] > 0.6
    assert ns["est"].nll_ < ns["nll_truth"]
    assert ns["alpha_nll"] in ns["alphas"] and len(ns["held"]) == len(ns["alphas"])


def _check_nuts(ns):
    # NUTS on (alpha, b0) inside HMCGibbs finds the 3 groups; NUTS and the exact Escobar-West
    # update agree on E[alpha | X] (posterior sd about 0.6; measured difference 0.13)
    assert ns["ari"] > 0.9
    assert abs(ns["alpha_nuts"].mean() - ns["alpha_ew"].mean()) < 0.4
    assert ns["samples"]["b0"].min() > 0


def _check_tgmcmc(ns):
    # from one cluster, split-merge and tgMCMC reach partitions at least as good as the truth's;
    # tgMCMC's global moves are accepted far more often than split-merge's
    traces, truth = ns["traces"], ns["truth"]
    assert traces["tgMCMC"].max() > truth - 5 and traces["split-merge"].max() > truth - 5
    assert set(traces) == {"Gibbs", "split-merge", "tgMCMC"}
    assert ns["accepted"]["tgMCMC"] > 3 * ns["accepted"]["split-merge"]


def _check_trees(ns):
    # the best tree's top split is the true one, in nearly all draws
    assert ns["ari_top"] == 1.0 and ns["share"] > 0.8


CHECKS = {
    "quickstart.ipynb": _check_quickstart, "mapdp.ipynb": _check_mapdp,
    "composing_with_nuts.ipynb": _check_nuts, "tgmcmc_vs_gibbs.ipynb": _check_tgmcmc,
    "trees.ipynb": _check_trees,
}


def test_every_notebook_has_checks():
    assert {p.name for p in NOTEBOOKS} == set(CHECKS)
