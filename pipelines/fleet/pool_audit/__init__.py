"""Pool audit (runs-fleet's ``pool_audit`` housekeeping task): what idle fleet capacity costs, per pool.
Plain modules (no Dagster); the Dagster layer is ``pipelines/fleet/defs/pool_audit.py``."""
