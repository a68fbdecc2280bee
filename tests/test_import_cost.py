"""Loading the code location imports no heavy library it does not need at load.

pandas (the pool audit) and dagster-celery (the cluster profile's executor) are imported where they
are used, so every code server and run worker of the ``local`` and ``prod`` deployments loads
without them. dagster-aws (and boto3 with it) is loaded: the resources are built on its
``ResourceWithBoto3Configuration``, ``SSMResource`` and ``S3Resource``, as the project's rule is to
use what dagster-aws ships. The figures are in benchmarks/RESULTS.md ("Loading the code location").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli  # loads the code location in fresh interpreters

ROOT = Path(__file__).resolve().parent.parent
NOT_AT_LOAD = ("pandas", "dagster_celery", "celery")


@pytest.mark.parametrize("deployment", ["local", "prod"])
def test_loading_the_code_location_imports_no_heavy_library(deployment):
    code = (
        "import sys, json, pipelines.definitions as d; "
        "assert d.defs.resolve_all_job_defs(); "
        f"print(json.dumps([m for m in {NOT_AT_LOAD!r} if m in sys.modules]))"
    )
    env = {**os.environ, "DAGSTER_DEPLOYMENT": deployment, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
