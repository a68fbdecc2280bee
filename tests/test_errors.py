"""Bad environment: one clear line that names the problem, not a botocore stack trace."""

import dagster as dg
import pytest
from botocore.exceptions import ClientError

from infra.demo.definitions import build_local_definitions
from pipelines.common.defs.failures import one_line_failures
from resources import explain_aws_error


@one_line_failures
def _aws_work(context, exc: Exception):
    """A body under the one AWS failure policy whose AWS work raises ``exc``."""
    raise exc


def _run_demo(instance):
    return (
        build_local_definitions()
        .resolve_job_def("demo_traffic")
        .execute_in_process(instance=instance, raise_on_error=False)
    )


def test_missing_environment_variable_names_it(aws, monkeypatch):
    monkeypatch.delenv("BATCH_RECORDS_TABLE")
    result = _run_demo(dg.DagsterInstance.ephemeral())
    [failure] = [e for e in result.all_events if e.event_type_value == "RESOURCE_INIT_FAILURE"]
    line = "resource batching: the environment variable BATCH_RECORDS_TABLE is not set"
    assert failure.event_specific_data.error.message.strip().endswith(line)


@pytest.mark.slow
def test_unreachable_endpoint_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    for name, value in {
        "AGENDA_PROGRESS_TABLE": "t",
        "AGENDA_READY_TABLE": "t",
        "RUNS_FLEET_JOBS_TABLE": "t",
        "RUNS_FLEET_POOLS_TABLE": "t",
        "RUNS_FLEET_TERMINATION_QUEUE_URL": "q",
        "RUNS_FLEET_TERMINATION_DLQ_URL": "q",
        "RUNS_FLEET_HOUSEKEEPING_QUEUE_URL": "q",
        "RUNS_FLEET_HOUSEKEEPING_DLQ_URL": "q",
        "RUNS_FLEET_ARCHIVE_BUCKET": "b",
        "RECEIVERS_TABLE": "t",
        "BATCH_RECORDS_TABLE": "t",
        "BATCH_OUTBOX_BUCKET": "b",
    }.items():
        monkeypatch.setenv(name, value)
    result = _run_demo(dg.DagsterInstance.ephemeral())
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    error = failure.step_failure_data.error
    assert error.message.strip().splitlines() == [error.message.strip().splitlines()[0]]
    assert "cannot reach the AWS endpoint http://127.0.0.1:9" in error.message
    assert "EndpointConnectionError" not in error.message


def test_missing_table_is_explained():
    exc = ClientError(
        {"Error": {"Code": "ResourceNotFoundException", "Message": "Requested resource not found"}}, "PutItem"
    )
    assert "check the table, queue and bucket environment variables" in explain_aws_error(exc)
    with dg.build_op_context() as context, pytest.raises(dg.Failure, match="PutItem: ResourceNotFoundException"):
        _aws_work(context, exc)


def test_a_sensor_fails_its_tick_with_the_same_line_and_is_not_retried():
    exc = ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "GetQueueAttributes")
    with pytest.raises(dg.Failure, match="GetQueueAttributes was throttled") as info:
        _aws_work(dg.build_sensor_context(), exc)
    assert not info.value.allow_retries


def test_where_nothing_retries_other_errors_pass_through_untouched():
    with dg.build_op_context() as context, pytest.raises(KeyError):
        _aws_work(context, KeyError("x"))


SIGNATURE_XML = (
    '<?xml version="1.0" encoding="utf-8"?>\n<ErrorResponse><Errors><Error><Code>SignatureDoesNotMatch</Code>'
    "<Message>The request signature we calculated does not match the signature you provided. Check your AWS "
    "Secret Access Key and signing method.</Message><Type>Sender</Type></Error></Errors></ErrorResponse>"
)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        # what moto (and a query-protocol service) answers to a wrong secret key: the XML unparsed
        ({"Code": "403", "Message": SIGNATURE_XML}, "SignatureDoesNotMatch"),
        (
            {"Code": "SignatureDoesNotMatch", "Message": "The request signature we calculated does not match"},
            "SignatureDoesNotMatch",
        ),  # fmt: skip
        ({"Code": "InvalidSignatureException", "Message": "Signature expired"}, "InvalidSignatureException"),
        ({"Code": "IncompleteSignature", "Message": "Missing Authorization"}, "IncompleteSignature"),
    ],
)
def test_a_wrong_secret_key_is_one_line_that_names_the_setting(error, code):
    exc = ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 403}}, "ListQueues")
    explained = explain_aws_error(exc)
    assert explained is not None
    assert "\n" not in explained
    assert "<" not in explained
    assert code in explained
    assert "AWS_SECRET_ACCESS_KEY" in explained
    with dg.build_op_context() as context, pytest.raises(dg.Failure) as info:
        _aws_work(context, exc)
    assert info.value.description == explained


def test_an_unparsed_xml_error_is_read_for_its_code_and_message():
    xml = SIGNATURE_XML.replace("SignatureDoesNotMatch", "AccessDenied")
    exc = ClientError({"Error": {"Code": "403", "Message": xml}}, "ListQueues")
    explained = explain_aws_error(exc)
    assert explained.startswith("ListQueues: AccessDenied: The request signature")
    assert "<" not in explained
    assert "\n" not in explained


# ------------------------------------------------------------------ the first line of an error


def test_the_first_line_of_an_error_is_its_first_non_blank_line_collapsed():
    from pipelines.common import first_line

    assert first_line(ValueError("\n  relation  x\tdoes not exist \nLINE 1: SELECT ...")) == "relation x does not exist"


def test_a_first_line_that_introduces_what_follows_keeps_it():
    from botocore.exceptions import ParamValidationError

    from pipelines.common import first_line

    exc = ParamValidationError(report="Invalid type for parameter Item.v, value: 1")
    assert first_line(exc) == "Parameter validation failed: Invalid type for parameter Item.v, value: 1"


def test_an_error_without_text_is_its_class_name_and_no_text_is_empty():
    from pipelines.common import first_line

    assert [first_line(TimeoutError()), first_line(None), first_line("  \n ")] == ["TimeoutError", "", ""]


def test_a_long_first_line_is_cut_to_the_limit_with_an_ellipsis():
    from pipelines.common import first_line

    assert first_line("x" * 500, 10) == "x" * 9 + "…"


def _product_functions_named(names: set[str]) -> list[str]:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for package in ("pipelines", "resources", "sensors"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") in names:
                    found.append(f"{path.relative_to(root)} {node.name}")
    return found


def test_one_helper_gives_the_first_line_of_an_error():
    """``pipelines.common.first_line`` is the one rule; no module keeps its own copy."""
    assert _product_functions_named({"one_line", "first_line"}) == ["pipelines/common/__init__.py first_line"]
