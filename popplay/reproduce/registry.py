"""The figures ``popplay reproduce`` knows, one module of definitions per domain.

A domain module (e.g. :mod:`popplay.reproduce.bandit`) calls :func:`register` for
each of its figures when imported. To add a domain, write its module and name it in
:data:`DOMAIN_MODULES`; the driver, the CLI and ``popplay plot`` pick it up.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Callable, Protocol

from popplay.reproduce.data import FigureData

# Modules defining figures, imported on first use.
DOMAIN_MODULES: tuple[str, ...] = ("popplay.reproduce.bandit", "popplay.reproduce.cartpole",
                                   "popplay.reproduce.knights", "popplay.reproduce.reinforce",
                                   "popplay.reproduce.knights_ladder")

SCALES: tuple[str, ...] = ("tiny", "small", "paper")


class Context(Protocol):
    """What a figure's ``compute`` gets from the driver (see :class:`popplay.reproduce.driver.Session`)."""

    scale: str
    seed: int
    backend: Any  # popplay.core.backend.Backend

    def note(self, message: str) -> None:
        """Report progress to the user (one line)."""

    def memo(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()`` once per session: figures of one run share their experiments."""


@dataclass(frozen=True)
class Figure:
    """One figure of the report: how to compute its data and how to draw it.

    ``compute(ctx)`` returns the :class:`FigureData` written to ``<name>.h5``;
    ``draw(data, fig)`` draws it on a matplotlib figure (it runs again, unchanged, when
    ``popplay plot <name>.h5`` redraws a data file). ``summary(data)`` gives the
    headline numbers printed and returned by ``--json``. ``prepare(ctx)``, when given,
    runs for every chosen figure before any is computed: wall-clock measurements go
    there, so they are taken before long computations (and while the machine is as
    quiet as when the user started).
    """

    name: str
    domain: str
    title: str
    description: str
    compute: Callable[[Context], FigureData]
    draw: Callable[[FigureData, Any], None]
    summary: Callable[[FigureData], dict[str, Any]] = field(default=lambda data: {})
    prepare: Callable[[Context], None] | None = None


_FIGURES: dict[str, Figure] = {}
_loaded = False


def register(figure: Figure) -> Figure:
    if figure.name in _FIGURES and _FIGURES[figure.name] is not figure:
        raise ValueError(f"figure {figure.name!r} is registered twice")
    _FIGURES[figure.name] = figure
    return figure


def figures() -> dict[str, Figure]:
    """Every registered figure, in registration order."""
    global _loaded
    if not _loaded:
        for module in DOMAIN_MODULES:
            import_module(module)
        _loaded = True
    return dict(_FIGURES)


def domains() -> dict[str, list[str]]:
    """Figure names by domain (a domain name selects all its figures)."""
    out: dict[str, list[str]] = {}
    for figure in figures().values():
        out.setdefault(figure.domain, []).append(figure.name)
    return out


def resolve(target: str) -> list[Figure]:
    """``figure2`` → that figure; ``bandit`` → every bandit figure; ``all`` → all.

    Raises ValueError naming what is known when ``target`` is none of these.
    """
    known = figures()
    by_domain = domains()
    name = target.strip().lower()
    if name == "all":
        return list(known.values())
    if name in by_domain:
        return [known[n] for n in by_domain[name]]
    if name in known:
        return [known[name]]
    choices = ", ".join([*known, *by_domain, "all"])
    raise ValueError(f"unknown figure {target!r}; choose one of {choices}")
