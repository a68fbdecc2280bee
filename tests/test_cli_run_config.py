"""``python -m pipelines.cli``: a run config that Dagster would refuse before our code runs is
reported in one line, without a traceback; a good one runs through ``dagster job execute``."""

from __future__ import annotations

import json
import subprocess
import sys

import dagster as dg
import pytest

from pipelines import cli

BAD = [
    ("redrive_dead_letters", "unknown.json", '{"bogus": 1}', 'unexpected config entry "bogus" at the root'),
    ("housekeeping", "missing.json", "{}", 'Missing required config entry "task_type" at the root'),
    ("redrive_dead_letters", "type.json", '{"rate_per_second": "fast"}', "root:rate_per_second"),
    # a value outside the declared choices, refused by Dagster's config validation (an enum)
    (
        "redrive_dead_letters",
        "choice.json",
        '{"queue": "everything"}',
        "root:queue not in enum type RedriveSettings_queue",
    ),
    (
        "redrive_dead_letters",
        "array.json",
        "[1, 2]",
        "array.json: a run config is a mapping (a JSON object), not a list",
    ),
    (
        "redrive_dead_letters",
        "text.json",
        '"dry_run"',
        "text.json: a run config is a mapping (a JSON object), not a string",
    ),
    (
        "redrive_dead_letters",
        "bad.yaml",
        "queue: [termination\n",
        "bad.yaml: not valid YAML or JSON at line 2, column 1",
    ),
    ("no_such_job", "empty.json", "{}", "no job 'no_such_job' in the code location; one of: "),
    # an impossible date is text, as Dagster reads it (its YAML loader has no timestamps)...
    ("redrive_dead_letters", "date.yaml", "dry_run: 2026-13-45\n", 'Value "2026-13-45"'),
    # ... unless tagged as one
    ("redrive_dead_letters", "tagged.yaml", "dry_run: !!timestamp 2026-13-45\n", "tagged.yaml: not valid YAML"),
    ("redrive_dead_letters", "deep.json", '{"a": ' + "[" * 50_000 + "]" * 50_000 + "}", "deep.json: nested too deeply"),
    ("redrive_dead_letters", "deeper.json", '{"a": ' + "[" * 500 + "]" * 500 + "}", "deeper.json: nested too deeply"),
    ("redrive_dead_letters", "key.yaml", "1: x\n", "key.yaml: the key 1 at root is not text"),
    ("redrive_dead_letters", "inner.yaml", "queue: {true: x}\n", "inner.yaml: the key True at root:queue is not text"),
    (
        "redrive_dead_letters",
        "bytes.yaml",
        "queue: !!binary aGVsbG8=\n",
        "bytes.yaml: the value at root:queue is bytes",
    ),
]


@pytest.mark.parametrize(("job", "name", "text", "expected"), BAD, ids=[b[1] for b in BAD])
def test_a_bad_run_config_is_one_line_and_exit_status_2(tmp_path, capsys, job, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    assert cli.main([job, "-c", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert expected in line
    if not expected.startswith(name) and not line.startswith("no job"):
        assert line.startswith(f"invalid run config for {job}: ")


RECLAIM = '{"tableName": "t", "idFieldName": "id", "timeFieldName": "updatedTime", "segments": 0}'
OUT_OF_RANGE = [
    ("reclaim_agendas", RECLAIM, "invalid run config for reclaim_agendas: segments must be at least 1, got 0"),
    (
        "redrive_dead_letters",
        '{"dry_run": true, "dryRun": false}',
        "invalid run config for redrive_dead_letters: dry_run=True and its old name dryRun=False disagree: give one",
    ),
]


@pytest.mark.parametrize(("job", "text", "expected"), OUT_OF_RANGE, ids=["range", "old_name"])
def test_a_value_the_schema_takes_but_the_parameters_refuse_is_one_line_and_no_run(
    tmp_path, monkeypatch, capsys, job, text, expected
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert cli.main([job, "--config-json", text]) == 2
    assert capsys.readouterr().err.splitlines() == [expected]
    with dg.DagsterInstance.get() as instance:
        assert instance.get_runs() == []


@pytest.mark.cli
def test_through_the_command_line_no_traceback_comes_before_the_line(aws_shared, tmp_path):
    env = {k: v for k, v in aws_shared.subprocess_env().items() if k != "DAGSTER_HOME"}
    bad = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "redrive_dead_letters", "--config-json", '{"bogus": 1}'],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stdout + bad.stderr
    assert bad.stderr.splitlines()[0].startswith("invalid run config for redrive_dead_letters: Received unexpected")

    good = tmp_path / "redrive.yaml"
    good.write_text("dry_run: true\nmax_seconds: 1\n")
    ran = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "redrive_dead_letters", "-c", str(good)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output[-4000:]
    assert "RUN_SUCCESS" in output


def test_several_files_merge_as_dagster_merges_them(tmp_path):
    (tmp_path / "a.yaml").write_text("ops:\n  x:\n    config:\n      a: 1\n      b: 1\n")
    (tmp_path / "b.json").write_text(json.dumps({"ops": {"x": {"config": {"b": 2}}}}))
    merged = cli.read_run_config([str(tmp_path / "a.yaml"), str(tmp_path / "b.json")], None)
    assert merged == {"ops": {"x": {"config": {"a": 1, "b": 2}}}}


@pytest.mark.cli
def test_an_unknown_deployment_is_one_line_and_exit_status_1(tmp_path):
    import os

    env = {**os.environ, "DAGSTER_DEPLOYMENT": "staging"}
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "redrive_dead_letters", "--config-json", "{}"],
        cwd=cli.ROOT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["DAGSTER_DEPLOYMENT='staging' is not one of local, prod, cluster"]
