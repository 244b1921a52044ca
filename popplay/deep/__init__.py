"""Deep reinforcement learning: environments, agents and the topologies that place
their actors and learners on processes."""
