"""Deep agents: networks, losses and replay, one file per algorithm (torch only).

An agent knows nothing of processes or environments' ids: topologies
(:mod:`popplay.deep.topologies`) decide who runs what where and move the agent's tensors
(:func:`popplay.deep.agents.networks.flat_parameters`) between ranks. Everything an agent
holds is a tensor, so run files store it as arrays (no pickle).
"""
