"""Who runs what where: topologies of the deep agents over ranks.

A topology combines an agent (:mod:`popplay.deep.agents`), environments
(:mod:`popplay.deep.envs`) and, across processes, :mod:`popplay.distributed`. Rank 0 (the
learner or server) drives a deep experiment through :func:`popplay.training.pipeline.train`,
exactly as a population does, so run files, checkpoints, the console and ``--resume``
are the populations' own; one phase of the experiment is one round of the topology.
"""
