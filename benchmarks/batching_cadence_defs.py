"""Code location of the batching cadence benchmark (``benchmarks/batching_cadence.py``): batching's own
definitions as the local deployment builds them (the decider, the minute and partition jobs, the
handoff and sync sensors, the checks), with the local resources, and nothing of the other
capabilities: every run and tick the daemon makes is batching's."""

import dagster as dg

from pipelines.batching.defs import build_defs
from resources import resources_for

defs = dg.Definitions.merge(build_defs(), dg.Definitions(resources=resources_for("local")))
