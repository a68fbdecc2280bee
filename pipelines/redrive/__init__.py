"""Redrive failed partitions: relaunch exactly the failed (optionally missing) partitions of a
partitioned asset. Not the fleet's dead-letter redrive (``pipelines.fleet.dead_letter_redrive``)."""
