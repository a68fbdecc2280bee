"""runs-fleet's queue processors: termination and housekeeping queues, cleanup tasks, dead letters.

Plain modules over boto3 clients (no Dagster imports): ``messages`` (parsing and validation),
``aws`` (batched SQS/SSM/S3/CloudWatch helpers, each call retried by runs-fleet's policy),
``drain`` (the receive loop with graceful stop, and its parameters), ``termination``,
``housekeeping`` (the tasks and their dispatcher, which takes more tasks by injection),
``dead_letters`` (redrive and quarantine, and its parameters). The ``defs`` subpackage is the thin
Dagster layer (jobs, sensors, schedules, checks).
"""
