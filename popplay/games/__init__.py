"""Population domains, one subpackage each (``bandit``, ``cartpole``, ``knights``): the
rules of the game written once for every backend, their engines and their experiment."""
