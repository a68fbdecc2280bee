"""Fleet queue processors (seed 002): termination and housekeeping queues, cleanup tasks, dead letters.

Plain modules over boto3 clients (no Dagster imports): ``messages`` (parsing and validation),
``aws`` (batched SQS/SSM/S3/CloudWatch helpers and the seed's backoff), ``drain`` (the receive
loop with graceful stop), ``termination``, ``housekeeping`` (the tasks and their dispatcher),
``dead_letters`` (redrive and quarantine). ``defs.py`` is the thin Dagster layer.
"""
