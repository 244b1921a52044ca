"""Warnings about a population's schedule: operators its budget never reaches
(silently no sharing or no replication is not what anyone asking for them wants)."""
from __future__ import annotations


def share_warning(steps_per_agent: int, share_every: int) -> list[str]:
    if share_every > steps_per_agent:
        return [f"--share-every {share_every:,} is more than the {steps_per_agent:,} steps each agent takes: "
                "the agents learn alone and share only once, at the end"]
    return []


def replication_warning(replicate_every: int, phases: int, unit: str) -> list[str]:
    if replicate_every and replicate_every > phases:
        return [f"--replicate-every {replicate_every:,} is more than the run's {phases:,} {unit}: "
                "no replication will happen"]
    return []
