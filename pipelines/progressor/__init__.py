"""Progressor zombie collection: plain logic over psycopg2; Dagster wiring in ``defs.py``."""
