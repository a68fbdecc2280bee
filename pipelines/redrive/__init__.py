"""Redrive failed partitions: relaunch exactly the failed (optionally missing) partitions of a
partitioned asset, bounded and tagged, with a per-partition outcome (``plan``, ``params``; the
Dagster layer in ``defs``). Not the fleet's dead-letter redrive
(``pipelines.fleet.dead_letter_redrive``, job ``redrive_dead_letters``), which moves SQS messages."""
