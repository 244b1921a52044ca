"""Double DQN's update through torch's own machinery (for tests and the update timing
in benchmarks/deep.py).

This is how the learner updated before :mod:`popplay.deep.agents.flat`: autograd through
:func:`popplay.deep.agents.dqn.dqn_loss` and :func:`popplay.deep.agents.dqn.double_dqn_targets`,
``clip_grad_norm_`` and ``torch.optim.Adam(fused=True)``. It shares the learner's replay
buffer and draws the same minibatches from its own copy of the sampling generator.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from popplay.deep.agents import dqn
from popplay.deep.agents import networks


class AutogradDoubleDQN:
    """Networks, optimiser and sampler of ``agent`` as it is now, updated the autograd way."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.config = agent.config
        self.online = networks.mlp(agent.obs_dim, agent.actions, agent.config.hidden)
        self.target = networks.mlp(agent.obs_dim, agent.actions, agent.config.hidden)
        self.online.load_state_dict(agent.online.state_dict())
        self.target.load_state_dict(agent.target.state_dict())
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=agent.config.lr, fused=True)
        self.sampler = networks.generator(0)
        self.sampler.set_state(agent.sampler.get_state())
        self.updates = agent.updates

    def update(self) -> float:
        config = self.config
        batch = self.agent.replay.sample(config.batch_size, self.sampler)
        for group in self.optimizer.param_groups:
            group["lr"] = dqn.learning_rate(self.updates, config)
        self.optimizer.zero_grad(set_to_none=True)
        loss = dqn.dqn_loss(batch, self.online, dqn.double_dqn_targets(batch, self.online, self.target, config.gamma))
        loss.backward()
        nn.utils.clip_grad_norm_(self.online.parameters(), config.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        if self.updates % config.target_every == 0:
            self.target.load_state_dict(self.online.state_dict())
        return float(loss.detach())
