"""Round-robin tournaments and ratings from win/draw matrices."""
