"""runs-fleet's clean-up tasks, one module each, listed in ``pipelines.fleet.housekeeping.TASKS``."""
