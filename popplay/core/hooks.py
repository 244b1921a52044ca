"""Faults and delays that tests inject into running processes, read from the
environment so that they never reach a parameter dataclass or a run file.

``POPPLAY_TEST_<NAME>=value`` sets hook ``name`` (0, the default, is off); launched
ranks inherit the environment, so a hook set for a command reaches every rank.
"""
from __future__ import annotations

import os

PREFIX = "POPPLAY_TEST_"


def hook(name: str) -> float:
    """The value of test hook ``name`` (0.0 when unset or unreadable)."""
    try:
        return float(os.environ.get(PREFIX + name.upper(), "0") or 0)
    except ValueError:
        return 0.0


def variable(name: str) -> str:
    """The environment variable that sets hook ``name``."""
    return PREFIX + name.upper()
