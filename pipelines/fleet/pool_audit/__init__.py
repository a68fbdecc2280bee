"""Pool audit: what idle fleet capacity costs, per pool (plain; its Dagster layer is ``fleet/defs/pool_audit.py``)."""
