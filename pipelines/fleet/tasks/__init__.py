"""runs-fleet's clean-up tasks, one module each exporting its ``TASK``, listed in
``pipelines.fleet.housekeeping.TASKS``."""
