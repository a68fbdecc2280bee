"""The run tags of run-level retries (docs/retry.md, "Run retries") and the Dagster tags read with them; no Dagster."""

POLICY_TAG = "groundskeeper/retry_policy"  # <preset name | none | JSON policy>
ATTEMPT_TAG = "groundskeeper/retry_attempt"  # 1 for the original run, 2 for its first retry...
RETRY_OF_TAG = "groundskeeper/retry_of"  # the failed run this run retries
ROOT_TAG = "groundskeeper/retry_root"  # the original run of the chain
DAGSTER_PARENT_TAG = "dagster/parent_run_id"  # Dagster's, on a re-execution (its retry, or by hand) of a run
PARTITION_TAG = "dagster/partition"  # Dagster's, on a run of one partition
