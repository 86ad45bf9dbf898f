"""Settings of a run: `RunConfig` and `MaskOptions`, and how a config file and flags make them."""
