"""What every layer shares and nothing of popplay's above it: errors with exit codes,
the experiment protocol and its curves, backends and shard layouts, memory limits and
the registry of domains."""
