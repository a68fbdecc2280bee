"""Redrive failed partitions: relaunch exactly the failed (optionally missing) partitions of a
partitioned asset, bounded and tagged, with a per-partition outcome (``plan``, ``params``; the
Dagster layer in ``defs``)."""
