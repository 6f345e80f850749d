"""Models of the four kinds, quantities and names: the one source of truth of elasticgpu."""
