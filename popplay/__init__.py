"""popplay: evolutionary population reinforcement learning."""
__version__ = "0.1.0"
