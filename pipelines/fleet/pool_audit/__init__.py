"""Pool audit (runs-fleet's ``pool_audit`` housekeeping task): what idle fleet capacity costs, per pool.

Plain modules (no Dagster): ``params`` (the parameters, declared once), ``audit`` (one audit end to
end, one daily report), ``compute`` (pandas), ``checks`` (the check evaluations, as plain values),
``housekeeping`` (the audit as a housekeeping task), ``store`` (its AWS reads and writes),
``prices``, ``render``. Its Dagster layer is the fleet's ``pipelines/fleet/defs/pool_audit.py``."""
