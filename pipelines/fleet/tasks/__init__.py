"""runs-fleet's clean-up tasks, one module each, each exporting its ``TASK``
(``pipelines.common.task.Task``): ``orphaned_instances``, ``stale_ssm``, ``old_jobs``. The
housekeeping dispatcher lists them (``pipelines.fleet.housekeeping.TASKS``). ``instances``: the
``DescribeInstances`` reads they share."""
