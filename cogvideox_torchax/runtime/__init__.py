"""The runtime: `TorchaxVAE`, its compiled programs, what runs on a target, and the memory planner."""
