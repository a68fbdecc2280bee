"""The Dagster helpers every capability shares, one module per kind."""
