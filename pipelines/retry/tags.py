"""The run tags of run-level retries (no Dagster): the policy a job's runs retry by, and what the
``delayed_run_retries`` sensor writes on a re-launched run. The sensor (``sensors.run_retries``),
the retry demo job and any job that opts in use these names."""

POLICY_TAG = "groundskeeper/retry_policy"  # <preset name | none | JSON policy>
ATTEMPT_TAG = "groundskeeper/retry_attempt"  # 1 for the original run, 2 for its first retry...
RETRY_OF_TAG = "groundskeeper/retry_of"  # the failed run this run retries
ROOT_TAG = "groundskeeper/retry_root"  # the original run of the chain
