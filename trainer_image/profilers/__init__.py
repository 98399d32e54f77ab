"""`sailplan-profile`: measured compute and network profiles in the planner's format (cli.py)."""
