"""Memory: budgets, the planner that picks a plan from compiled bytes, the out-of-memory retry, bytes in use."""
