"""Unit tests of the pure retry library: forms, JSON, presets (by hand from the published
formulas), errors, the simulator and the AWS error classifier."""

import dataclasses
import json
import random

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from pipelines.retry import (
    PRESETS,
    STOP,
    DelayFunctionError,
    RetryPolicyError,
    classify_aws_error,
    exponential,
    fixed,
    function,
    human,
    is_transient,
    none,
    policy_from_json,
    policy_from_text,
    preset,
    timeline,
)
from pipelines.retry.runs import run_retry
from pipelines.retry.tags import POLICY_TAG


def client_error(code: str, status: int = 400, op: str = "PutItem") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, op)


# -- forms -----------------------------------------------------------------------------------


def test_none_runs_once():
    p = none()
    assert p.max_attempts == 1
    assert p.delay(0) == 0.0
    assert p.delay(1) is STOP
    assert not STOP
    assert repr(STOP) == "STOP"


def test_fixed():
    p = fixed(30, 3)
    assert [p.delay(n) for n in range(5)] == [0.0, 30.0, 30.0, STOP, STOP]
    assert p.max_attempts == 3


def test_exponential_without_jitter_caps_at_max_delay():
    p = exponential(5, 2, 60, 10)
    assert [p.delay(n) for n in range(1, 6)] == [5.0, 10.0, 20.0, 40.0, 60.0]
    assert p.delay(10) is STOP
    # a huge n never overflows past the cap
    assert exponential(1, 10, 100, None).delay(5000) == 100.0


def test_an_exponential_from_zero_waits_zero_however_many_attempts():
    assert exponential(0, 2, None, None).delay(2000) == 0.0  # 2 ** 1999 is past the largest float
    assert exponential(0, 100, 60, None).delay(200) == 0.0


def test_without_max_delay_no_delay_is_longer_than_thirty_days():
    assert exponential(5, max_attempts=25).delay(24) == 30 * 86_400


def test_a_formula_past_the_largest_float_waits_thirty_days_and_sketches():
    policy = exponential(1, 100, max_attempts=None)
    assert policy.delay(160) == 30 * 86_400
    timeline(policy, 200).sketch()  # raised on the infinite delay


@pytest.mark.parametrize(
    "jitter,low,high",
    [("full", 0.0, 40.0), ("plus-minus", 36.0, 44.0), ("none", 40.0, 40.0)],
)
def test_exponential_jitter_stays_in_its_bounds(jitter, low, high):
    p = exponential(5, 2, 3600, 10, jitter)
    assert p.bounds(4) == pytest.approx((low, high))
    rng = random.Random(7)
    samples = [p.delay(4, rng) for _ in range(500)]
    assert all(low - 1e-9 <= s <= high + 1e-9 for s in samples)
    if jitter != "none":
        assert len(set(samples)) > 100


def test_plus_minus_ratio_and_cap_applies_after_jitter():
    p = exponential(100, 1, 100, None, "plus-minus", jitter_ratio=0.5)
    assert p.bounds(1) == (50.0, 100.0)
    assert policy_from_json(p.to_json()) == p


def test_function_policy_and_its_cap():
    p = function("tests.retry_delay_functions:linear")
    assert [p.delay(n) for n in range(5)] == [0.0, 10.0, 20.0, STOP, STOP]
    capped = function("tests.retry_delay_functions:linear", 2)
    assert capped.delay(2) is STOP


def test_a_failing_delay_function_is_a_policy_error_naming_it():
    p = policy_from_json({"kind": "function", "path": "tests.retry_delay_functions:broken", "maxAttempts": 10})
    assert p.delay(1) == 1.0
    with pytest.raises(DelayFunctionError, match=r"tests.retry_delay_functions:broken.*n=2.*ZeroDivisionError") as info:
        p.delay(2)
    assert info.value.field == "path"
    assert not p.is_retryable(info.value)  # never retried
    with pytest.raises(DelayFunctionError, match="returned -5"):
        function("tests.retry_delay_functions:negative").delay(1)


def test_is_retryable_by_class_name_dotted_name_base_class_and_aws_code():
    p = policy_from_json(
        {"kind": "fixed", "delay": 1, "maxAttempts": 3, "nonRetryable": ["KeyError", "ValidationException"]}
    )
    assert not p.is_retryable(KeyError("x"))
    assert p.is_retryable(ValueError("x"))
    assert not p.is_retryable(client_error("ValidationException"))
    assert p.is_retryable(client_error("ThrottlingException"))
    assert not fixed(1, 2, non_retryable=["LookupError"]).is_retryable(KeyError("x"))  # base class
    assert not fixed(1, 2, non_retryable=["builtins.KeyError"]).is_retryable(KeyError("x"))
    assert not p.is_retryable("KeyError")


# -- JSON ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": "none"},
        {"kind": "fixed", "delay": 30, "maxAttempts": 3},
        {"kind": "exponential", "initial": 5, "coefficient": 2, "maxDelay": 3600, "maxAttempts": 5, "jitter": "full"},
        {"kind": "preset", "name": "sidekiq"},
        {"kind": "function", "path": "tests.retry_delay_functions:linear", "maxAttempts": 10},
        {"kind": "fixed", "delay": 1, "maxAttempts": None, "nonRetryable": ["ValueError"]},
    ],
)
def test_the_rfc_json_forms_build_and_round_trip(obj):
    p = policy_from_json(obj)
    assert policy_from_json(p.to_json()) == p
    assert policy_from_json(__import__("json").dumps(obj)) == p


def test_the_rfc_examples_give_the_expected_delays():
    assert policy_from_json({"kind": "fixed", "delay": 30, "maxAttempts": 3}).delay(2) == 30.0
    p = policy_from_json(
        {"kind": "exponential", "initial": 5, "coefficient": 2, "maxDelay": 3600, "maxAttempts": 5, "jitter": "full"}
    )
    assert p.bounds(3) == (0.0, 20.0)
    assert p.delay(5) is STOP
    assert policy_from_json({"kind": "preset", "name": "sidekiq"}) is PRESETS["sidekiq"]


@pytest.mark.parametrize(
    "obj,field,value",
    [
        ({"kind": "linear"}, "kind", "linear"),
        ({"delay": 3}, "kind", None),
        ({"kind": "fixed", "delay": -1, "maxAttempts": 3}, "delay", -1),
        ({"kind": "fixed", "delay": 1, "maxAttempts": 0}, "maxAttempts", 0),
        ({"kind": "fixed", "delay": 1, "maxAttempts": 2.5}, "maxAttempts", 2.5),
        ({"kind": "fixed", "delay": "30", "maxAttempts": 2}, "delay", "30"),
        ({"kind": "fixed", "delay": 30}, "maxAttempts", None),
        ({"kind": "fixed", "delay": 30, "maxAttempts": 3, "maxAttempt": 3}, "maxAttempt", 3),
        ({"kind": "exponential", "initial": -5, "maxAttempts": 3}, "initial", -5),
        ({"kind": "exponential", "initial": 5, "maxAttempts": 3, "maxDelay": -1}, "maxDelay", -1),
        ({"kind": "exponential", "initial": 5, "maxAttempts": 3, "coefficient": 0.5}, "coefficient", 0.5),
        ({"kind": "exponential", "initial": 5, "maxAttempts": 3, "jitter": "half"}, "jitter", "half"),
        (
            {"kind": "exponential", "initial": 5, "maxAttempts": 3, "jitter": "plus-minus", "jitterRatio": 2},
            "jitterRatio",
            2,
        ),
        ({"kind": "preset", "name": "resque"}, "name", "resque"),
        ({"kind": "function", "path": "mypkg..policies:delay"}, "path", "mypkg..policies:delay"),
        ({"kind": "function", "path": "mypkg.policies.delay"}, "path", "mypkg.policies.delay"),
        ({"kind": "function", "path": "no_such_module_x:delay"}, "path", "no_such_module_x:delay"),
        (
            {"kind": "function", "path": "tests.retry_delay_functions:NOT_CALLABLE"},
            "path",
            "tests.retry_delay_functions:NOT_CALLABLE",
        ),
        ({"kind": "function", "path": "tests.retry_delay_functions:linear", "maxAttempts": -2}, "maxAttempts", -2),
        ({"kind": "none", "nonRetryable": "ValueError"}, "nonRetryable", "ValueError"),
        ({"kind": []}, "kind", []),
        ({"kind": {}}, "kind", {}),
        ({"kind": "exponential", "initial": 5, "maxAttempts": 5, "jitter": {}}, "jitter", {}),
        ({"kind": "exponential", "initial": 5, "maxAttempts": 5, "jitter": ["full"]}, "jitter", ["full"]),
    ],
)
def test_bad_input_names_the_field_and_the_value(obj, field, value):
    with pytest.raises(RetryPolicyError) as info:
        policy_from_json(obj)
    assert info.value.field == field
    assert info.value.value == value
    assert field in str(info.value)
    if value is not None:
        assert repr(value) in str(info.value) or str(value) in str(info.value)


def test_not_json_and_not_an_object():
    for text in ("{not json", "[1, 2]"):
        with pytest.raises(RetryPolicyError) as info:
            policy_from_json(text)
        assert info.value.field == "policy"


def test_policy_from_text_takes_a_preset_name_none_or_json():
    assert policy_from_text("river") is PRESETS["river"]
    assert policy_from_text("none").max_attempts == 1
    assert policy_from_text(' {"kind": "fixed", "delay": 2, "maxAttempts": 2} ').delay(1) == 2.0
    with pytest.raises(RetryPolicyError, match="resque"):
        policy_from_text("resque")
    with pytest.raises(RetryPolicyError):
        policy_from_text("")


def test_a_run_tag_policy_with_non_retryable_is_refused_in_one_line():
    policy = {"kind": "fixed", "delay": 5, "maxAttempts": 3, "nonRetryable": ["ValidationException"]}
    decided = run_retry({POLICY_TAG: json.dumps(policy)}, "r")
    assert decided.wait is None
    assert decided.bad_tags is True
    assert "nonRetryable must be absent (a run retry never reads the run's error)" in decided.why
    assert "\n" not in decided.why


def test_n_must_be_a_non_negative_integer():
    for n in (-1, 1.5, True):
        with pytest.raises(RetryPolicyError) as info:
            fixed(1, 3).delay(n)
        assert info.value.field == "n"


# -- presets, checked against values computed by hand from each published formula ------------


def test_sidekiq():
    # delay_for(count) = count**4 + 15 + rand(10) * (count + 1); count = n - 1; 25 retries
    p = preset("sidekiq")
    assert p.max_attempts == 26
    assert [p.nominal(n) for n in (1, 2, 3, 4, 5)] == [15, 16, 31, 96, 271]
    assert p.nominal(25) == 24**4 + 15 == 331791
    assert p.delay(26) is STOP
    assert p.bounds(3) == (31, 31 + 9 * 3)
    assert {p.delay(3, random.Random(s)) - 31 for s in range(200)} == {3 * k for k in range(10)}
    # sum of c**4 for c = 0..24 is 24*25*49*(3*24**2 + 3*24 - 1)/30 = 1763020, plus 25 * 15
    assert sum(p.nominal(n) for n in range(1, 26)) == 1763020 + 375  # about 20.4 days before jitter


def test_oban():
    # 15 + 2**attempt, then up to +10% (jitter mode :inc); 20 attempts
    p = preset("oban")
    assert p.max_attempts == 20
    assert [p.nominal(n) for n in (1, 2, 3, 10)] == [17, 19, 23, 1039]
    assert p.bounds(1) == pytest.approx((17, 18.7))
    assert p.nominal(19) == 15 + 524288
    assert p.delay(20) is STOP
    assert sum(p.nominal(n) for n in range(1, 20)) == 1048859


def test_river():
    # attempt**4 seconds +/- 10%; 25 attempts
    p = preset("river")
    assert [p.nominal(n) for n in (1, 2, 3, 4)] == [1, 16, 81, 256]
    assert p.bounds(3) == pytest.approx((72.9, 89.1))
    assert p.nominal(24) == 331776
    assert p.delay(25) is STOP


def test_celery_and_celery_backoff():
    c = preset("celery")
    assert [c.delay(n) for n in range(1, 5)] == [180, 180, 180, STOP]
    b = preset("celery-backoff")
    assert [b.nominal(n) for n in (1, 2, 3)] == [1, 2, 4]
    assert b.delay(4) is STOP
    assert b.bounds(3) == (0.0, 4.0)
    unlimited = dataclasses.replace(b, max_attempts=None)
    assert unlimited.nominal(11) == 600.0  # 2**10 = 1024 capped by retry_backoff_max


def test_temporal():
    p = preset("temporal")
    assert p.max_attempts is None
    assert [p.nominal(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 64, 100, 100]
    assert p.delay(10_000) == 100.0
    assert p.bounds(5) == (16.0, 16.0)


def test_step_functions():
    p = preset("step-functions")
    assert [p.delay(n) for n in range(0, 5)] == [0.0, 1.0, 2.0, 4.0, STOP]


def test_every_preset_documents_its_source_and_round_trips():
    for name, p in PRESETS.items():
        assert p.source, name
        assert p.summary, name
        assert policy_from_json(p.to_json()) is p
        assert policy_from_json({"kind": "preset", "name": name, "nonRetryable": ["X"]}).non_retryable == ("X",)


# -- simulator -------------------------------------------------------------------------------


def test_timeline_of_exponential_with_full_jitter():
    p = exponential(5, 2, 3600, 5, "full")
    t = timeline(p)
    assert [s.attempt for s in t.steps] == [2, 3, 4, 5]
    assert [s.delay for s in t.steps] == [5, 10, 20, 40]
    assert [s.cumulative for s in t.steps] == [5, 15, 35, 75]
    assert [s.worst_case for s in t.steps] == [5, 15, 35, 75]  # full jitter only shortens
    assert [s.low for s in t.steps] == [0, 0, 0, 0]
    assert t.stopped
    assert t.attempts == 5
    assert t.total == 75
    md = t.to_markdown()
    assert "| 5 | 40s | 0s - 40s | 1m15s | 1m15s |" in md
    # 0, 5, 15, 35, 75 s on 20 characters
    assert [i for i, c in enumerate(t.sketch()) if c == "●"] == [0, 1, 4, 9, 19]


def test_timeline_worst_case_with_jitter_and_a_horizon_for_unlimited_policies():
    t = timeline(preset("river"), 4)
    assert [s.worst_case for s in t.steps] == pytest.approx([1.1, 18.7, 107.8])
    assert not t.stopped
    assert "simulation stops at 4 attempts" in t.to_markdown()
    assert t.sketch().endswith("…")
    assert timeline(preset("temporal")).attempts == 30
    assert timeline(none()).steps == ()
    assert timeline(none()).stopped


def test_timeline_reports_a_failing_delay_function():
    with pytest.raises(DelayFunctionError):
        timeline(function("tests.retry_delay_functions:broken", 5))


def test_human_durations():
    assert [human(x) for x in (0, 1.5, 59, 95, 3600, 90061)] == ["0s", "1.5s", "59s", "1m35s", "1h", "1d1h1m1s"]


# -- AWS errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        client_error("ThrottlingException"),
        client_error("ProvisionedThroughputExceededException"),
        client_error("SlowDown", 503),
        client_error("InternalServerError", 500),
        client_error("Whatever", 502),
        EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
        ConnectTimeoutError(endpoint_url="http://x"),
        ReadTimeoutError(endpoint_url="http://x"),
    ],
)
def test_transient_aws_errors(exc):
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        client_error("ValidationException"),
        client_error("AccessDeniedException", 403),
        client_error("AccessDenied", 403),
        client_error("ConditionalCheckFailedException"),
        client_error("ResourceNotFoundException"),
        ParamValidationError(report="bad"),
        NoCredentialsError(),
    ],
)
def test_permanent_aws_errors(exc):
    c = classify_aws_error(exc)
    assert c.kind == "permanent"
    assert not c.transient


def test_other_errors_are_not_aws_errors():
    assert classify_aws_error(ValueError("x")).kind == "not-aws"


# -- retry_call ------------------------------------------------------------------------------


def _flaky(errors):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return len(calls)

    return fn, calls


def test_retry_call_sleeps_the_policy_delays_between_transient_errors():
    from pipelines.retry import retry_call

    slept = []
    fn, calls = _flaky([client_error("ThrottlingException"), client_error("InternalError", 500)])
    assert retry_call(fn, exponential(1, 3, None, 5), sleep=slept.append) == 3
    assert slept == [1.0, 3.0]


def test_retry_call_stops_on_permanent_errors_and_when_the_policy_says_stop():
    from pipelines.retry import retry_call

    slept = []
    fn, calls = _flaky([client_error("ValidationException")])
    with pytest.raises(ClientError, match="ValidationException"):
        retry_call(fn, fixed(1, 5), sleep=slept.append)
    assert len(calls) == 1
    assert slept == []
    fn, calls = _flaky([client_error("ThrottlingException")] * 5)
    with pytest.raises(ClientError, match="ThrottlingException"):
        retry_call(fn, fixed(1, 3), sleep=slept.append)
    assert len(calls) == 3
    assert slept == [1.0, 1.0]
    fn, calls = _flaky([client_error("ThrottlingException")] * 5)
    with pytest.raises(DelayFunctionError):
        retry_call(fn, function("tests.retry_delay_functions:broken", 9), sleep=slept.append)
    assert len(calls) == 2


@pytest.mark.parametrize(
    "path",
    [
        "os:_exit",
        "subprocess:run",
        "tests.retry_delay_functions_x:linear",
        "tests:retry_delay_functions",
        "tests.retry_delay_functions:_private",
        "tests.retry_delay_functions:linear\n",
    ],  # fmt: skip
)
def test_a_function_policy_names_only_public_functions_of_registered_modules(path, monkeypatch):
    import sys

    monkeypatch.setenv("GROUNDSKEEPER_RETRY_FUNCTIONS", "tests.retry_delay_functions")
    monkeypatch.delitem(sys.modules, "tabnanny", raising=False)
    with pytest.raises(RetryPolicyError) as info:
        policy_from_json({"kind": "function", "path": path})
    assert info.value.field == "path"
    assert "\n" not in str(info.value).replace(repr(path), "")
    with pytest.raises(RetryPolicyError, match="GROUNDSKEEPER_RETRY_FUNCTIONS"):
        policy_from_json({"kind": "function", "path": "tabnanny:check"})
    assert "tabnanny" not in sys.modules  # refused before the import


def test_without_registered_modules_no_function_policy_is_allowed(monkeypatch):
    monkeypatch.delenv("GROUNDSKEEPER_RETRY_FUNCTIONS")
    with pytest.raises(RetryPolicyError, match=r"registered: none"):
        policy_from_json({"kind": "function", "path": "tests.retry_delay_functions:linear"})
    monkeypatch.setenv("GROUNDSKEEPER_RETRY_FUNCTIONS", " other.pkg , tests.retry_delay_functions ")
    assert policy_from_json({"kind": "function", "path": "tests.retry_delay_functions:linear"}).delay(1) == 10.0


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"kind": "fixed", "delay": 10**12, "maxAttempts": 3}, "delay"),
        ({"kind": "fixed", "delay": 5, "maxAttempts": 10**9}, "maxAttempts"),
        ({"kind": "exponential", "initial": 1e300, "maxAttempts": 3}, "initial"),
        ({"kind": "exponential", "initial": 1, "maxDelay": 10**10, "maxAttempts": 3}, "maxDelay"),
        ({"kind": "exponential", "initial": 1, "coefficient": 1e6, "maxAttempts": 3}, "coefficient"),
        ({"kind": "function", "path": "tests.retry_delay_functions:linear", "maxAttempts": 10**6}, "maxAttempts"),
    ],
)
def test_every_number_of_a_json_policy_has_a_range(obj, field):
    with pytest.raises(RetryPolicyError) as info:
        policy_from_json(obj)
    assert info.value.field == field
    assert " to " in str(info.value)
    assert "\n" not in str(info.value)


def test_a_delay_function_answering_more_than_the_longest_wait_is_a_policy_error():
    with pytest.raises(DelayFunctionError, match="returned inf"):
        function("tests.retry_delay_functions:endless").delay(1)


@pytest.mark.parametrize(
    "path",
    [
        "tests.retry_delay_functions:sys.exit",  # a dotted walk through what the module imported
        "tests.retry_delay_functions:os.close",
        "tests.retry_delay_functions:time.sleep",
        "tests.retry_delay_functions:linear.__globals__",
        "tests.retry_delay_functions:close",  # a builtin under a public name of the module
        "tests.retry_delay_functions:sleep",
        "tests.retry_delay_functions:imported_helper",  # a function defined in an unregistered module
        "tests.retry_delay_functions:sys",  # a module
        "tests.retry_delay_functions:Escape",  # a class
    ],
)
def test_a_function_policy_names_only_a_function_defined_in_a_registered_module(path):
    with pytest.raises(RetryPolicyError) as info:
        policy_from_json({"kind": "function", "path": path, "maxAttempts": 3})
    assert (info.value.field, info.value.value) == ("path", path)
    message = str(info.value)
    assert message.splitlines() == [message]
    assert repr(path) in message


@pytest.mark.parametrize(
    ("name", "raised"), [("exits", "SystemExit"), ("interrupted", "KeyboardInterrupt"), ("escapes", "Escape")]
)
def test_a_delay_function_raising_any_base_exception_is_a_policy_error_never_an_exit(name, raised):
    policy = function(f"tests.retry_delay_functions:{name}", 5)
    with pytest.raises(DelayFunctionError) as info:
        policy.delay(1)
    message = str(info.value)
    assert message.splitlines() == [message]
    assert f"'tests.retry_delay_functions:{name}' failed for n=1: {raised}" in message
    assert not policy.is_retryable(info.value)


# -- a registered package with a command line ------------------------------------------------

PACKAGE = "tests.retry_function_package"


@pytest.fixture
def registered_package(monkeypatch):
    """``tests.retry_function_package`` registered beside the conftest's module; none of its modules
    that exit on import is loaded."""
    import sys

    monkeypatch.setenv("GROUNDSKEEPER_RETRY_FUNCTIONS", f"tests.retry_delay_functions,{PACKAGE}")
    for name in ("__main__", "_private", "tool"):
        monkeypatch.delitem(sys.modules, f"{PACKAGE}.{name}", raising=False)


@pytest.mark.parametrize(
    "path",
    [f"{PACKAGE}.__main__:main", f"{PACKAGE}._private:delay", f"{PACKAGE}.__init__:delay"],
)
def test_a_function_path_through_a_private_module_is_refused_and_never_imported(registered_package, path):
    import sys

    with pytest.raises(RetryPolicyError) as info:
        policy_from_json({"kind": "function", "path": path})
    message = str(info.value)
    assert message.splitlines() == [message]
    assert "'_'" in message
    assert info.value.field == "path"
    assert f"{PACKAGE}.__main__" not in sys.modules
    assert f"{PACKAGE}._private" not in sys.modules


def test_a_module_the_registry_has_not_imported_is_refused_and_never_imported(registered_package):
    import sys

    with pytest.raises(RetryPolicyError) as info:
        policy_from_json({"kind": "function", "path": f"{PACKAGE}.tool:delay"})
    message = str(info.value)
    assert message.splitlines() == [message]
    assert "not imported" in message
    assert f"{PACKAGE}.tool" not in sys.modules
    assert policy_from_json({"kind": "function", "path": f"{PACKAGE}:delay"}).delay(2) == 10.0


@pytest.mark.parametrize("raised", ["SystemExit", "KeyboardInterrupt", "Escape"])
def test_anything_a_registered_module_raises_on_import_is_a_policy_error(monkeypatch, raised):
    monkeypatch.setenv("GROUNDSKEEPER_RETRY_FUNCTIONS", "tests.retry_raising_module")
    monkeypatch.setenv("RETRY_TEST_IMPORT_RAISES", raised)
    with pytest.raises(RetryPolicyError) as info:
        policy_from_json({"kind": "function", "path": "tests.retry_raising_module:delay"})
    message = str(info.value)
    assert message.splitlines() == [message]
    assert f"cannot be imported: {raised}" in message


def test_a_policy_nested_too_deeply_is_a_policy_error():
    with pytest.raises(RetryPolicyError) as info:
        policy_from_text('{"kind": ' + "[" * 50_000 + "]" * 50_000 + "}")
    assert info.value.field == "policy"
