"""The plan: its model, the planner, saved and sealed plans, node commands, export, compare, cost, interval."""
