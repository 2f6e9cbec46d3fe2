"""Tests of cogvideox_torchax.memory: budgets, the planner's choice, retries, bytes in use, compiled memory."""
