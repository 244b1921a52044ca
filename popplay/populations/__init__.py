"""Population experiments: a domain's state, engines and operators behind one interface."""
