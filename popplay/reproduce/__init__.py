"""Regenerate the report's figures: data (HDF5) and plots (PNG).

* :mod:`popplay.reproduce.registry`: the figures known, one definitions module per domain;
* :mod:`popplay.reproduce.driver`: computes the chosen figures, writes and draws them;
* :mod:`popplay.reproduce.data`: the figure data files (h5py only, no pickle);
* :mod:`popplay.reproduce.timing`: what the domains share: batches, one-trial timing, drawing;
* :mod:`popplay.reproduce.bandit`: Bell's Figures 2–4;
* :mod:`popplay.reproduce.cartpole`: Bell's Figures 6–9;
* :mod:`popplay.reproduce.knights`: best/mean/worst of a population with and without selective replication (§3.4);
* :mod:`popplay.reproduce.reinforce`: REINFORCE's running reward for 1 to 15 workers;
* :mod:`popplay.reproduce.knights_ladder`: does knights self-play keep improving? Ladder Elo of four settings.
"""
from __future__ import annotations

from popplay.reproduce.data import FigureData, FigureFileError, Group, read_figure, write_figure
from popplay.reproduce.driver import ReproduceConfig, ReproduceOutcome, reproduce
from popplay.reproduce.registry import SCALES, Figure, figures, register, resolve

__all__ = [
    "SCALES", "Figure", "FigureData", "FigureFileError", "Group", "ReproduceConfig", "ReproduceOutcome",
    "figures", "read_figure", "register", "reproduce", "resolve", "write_figure",
]
