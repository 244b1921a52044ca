"""Run files and checkpoints (HDF5, no pickle)."""
