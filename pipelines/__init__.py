"""Groundskeeper's Dagster code: one subpackage per capability, assembled in ``definitions.py``."""
