"""Progressor zombie collection (seed 003): plain logic over psycopg2; Dagster wiring in ``defs.py``."""
