"""The Dagster helpers every capability shares, one module per kind; :func:`build_defs`: what spans them."""

import dagster as dg

from pipelines.common.defs.summary import operations_summary_asset


def build_defs(executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    """``operations_summary``, and the executor: in process (no process per step) unless given one."""
    return dg.Definitions(assets=[operations_summary_asset()], executor=executor or dg.in_process_executor)
