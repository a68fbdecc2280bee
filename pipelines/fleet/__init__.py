"""runs-fleet's queue processors (termination and housekeeping queues), clean-up tasks, dead letters
and the pool audit: plain modules over boto3 clients; ``defs`` is the thin Dagster layer."""
