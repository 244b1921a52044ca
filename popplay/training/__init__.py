"""The one training pipeline: the run loop, ``train()`` (validation, locks, checkpoints,
logs, seeds, time budgets, resume) and the glue to multi-process jobs."""
