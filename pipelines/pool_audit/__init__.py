"""Pool audit (seed 002, ``pool_audit``): what idle fleet capacity costs, per pool."""
