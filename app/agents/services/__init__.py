"""Agent registry services, one module per resource; routes call these and nothing else."""
