"""Retry benchmark: what a retry policy saves when AWS throttles, against naive retries.

Scenario 1, throttling: several threads write items to a DynamoDB table on a local moto server
while a token bucket in front of the client (a botocore ``before-call`` hook) throttles calls
above a fixed rate, as DynamoDB does. A throttled call still counts as an API call.
- baseline: retry at once after a throttle (a tight loop);
- policy: ``retry_call`` with exponential backoff and full jitter.

Scenario 2, permanent errors: items that DynamoDB refuses (ValidationException).
- baseline: retry every error 5 times;
- policy: ``retry_call`` classifies the error as permanent and stops after one call.

Scenario 3, the pure library: ``policy.delay`` throughput.

Each scenario runs ``--repeat`` rounds, the modes in rotating order (``benchmarks/trials.py``);
every run is verified (scenario 1: every item read back; scenario 2: every item refused).

    .venv/bin/python benchmarks/retry.py [--items 400] [--threads 8] [--rate 50]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import ClientError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import moto_server  # noqa: E402
import trials  # noqa: E402
from bench_support import all_pages  # noqa: E402

from infra.deploy import deploy, wait_for_endpoint  # noqa: E402
from pipelines.retry import (  # noqa: E402
    exponential,
    is_transient,
    preset,
    retry_call,
)


class TokenBucket:
    """Throttle calls above ``rate`` per second (burst ``burst``), counting every call."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self.tokens, self.stamp = float(burst), time.monotonic()
        self.calls = self.throttled = 0
        self.lock = threading.Lock()

    def __call__(self, **kwargs):
        with self.lock:
            self.calls += 1
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return None  # let the call through to moto
            self.throttled += 1
        body = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "throttled (benchmark)"}}
        return AWSResponse("http://throttle", 400, {}, None), {**body, "ResponseMetadata": {"HTTPStatusCode": 400}}


class Counter:
    def __init__(self):
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, **kwargs):
        with self.lock:
            self.calls += 1


def naive_retry(fn, tries: int):
    for attempt in range(1, tries + 1):
        try:
            return fn()
        except ClientError:
            if attempt == tries:
                raise


def start_moto() -> tuple[subprocess.Popen, str]:
    with tempfile.NamedTemporaryFile(prefix="bench-retry-moto-", suffix=".log", delete=False) as log:
        proc, endpoint = moto_server.start(log=log)
    wait_for_endpoint(endpoint, timeout_seconds=300)
    return proc, endpoint


def client(endpoint: str, hook) -> object:
    c = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(retries={"total_max_attempts": 1}, max_pool_connections=32),  # only our retries count
    )
    c.meta.events.register("before-call.dynamodb.PutItem", hook)
    return c


def written(endpoint: str, table: str, prefix: str) -> int:
    """Items of ``table`` whose id starts with ``prefix`` (a scan, read back after a run)."""
    c = client(endpoint, lambda **_: None)
    pages = all_pages(c.scan, TableName=table, Select="COUNT", FilterExpression="begins_with(id, :p)",
                      ExpressionAttributeValues={":p": {"S": prefix}})  # fmt: skip
    return sum(page["Count"] for page in pages)


def throttling(endpoint: str, table: str, items: int, threads: int, rate: float, mode: str) -> dict:
    bucket = TokenBucket(rate, burst=10)
    c = client(endpoint, bucket)
    policy = exponential(0.01, 2, 1.0, None, "full")
    prefix = f"{mode}-{uuid.uuid4().hex[:8]}-"

    def put(i: int) -> None:
        def call():
            return c.put_item(TableName=table, Item={"id": {"S": f"{prefix}{i}"}, "added": {"N": "1"}})

        if mode == "baseline":
            naive_retry(call, 100_000)
        else:
            retry_call(call, policy)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, range(items)))
    elapsed = time.perf_counter() - start
    done = written(endpoint, table, prefix)
    return trials.Run(elapsed, done, [] if done == items else [f"{items - done} of {items} items not written"],
                      calls=bucket.calls, extra={"throttled": bucket.throttled})  # fmt: skip


def permanent(endpoint: str, table: str, items: int, mode: str) -> dict:
    counter = Counter()
    c = client(endpoint, counter)
    policy = exponential(0.01, 2, 1.0, 5, "full")
    failed = 0
    start = time.perf_counter()
    for _ in range(items):

        def call():
            return c.put_item(TableName=table, Item={"id": {"N": "1"}})  # wrong key type: ValidationException

        try:
            naive_retry(call, 5) if mode == "baseline" else retry_call(call, policy)
        except ClientError as exc:
            failed += not is_transient(exc)
    elapsed = time.perf_counter() - start
    problems = [] if failed == items else [f"{items - failed} of {items} refused items did not fail"]
    return trials.Run(elapsed, failed, problems, calls=counter.calls)


def library(events: int, repeat: int) -> list[str]:
    policies = {"exponential": exponential(5, 2, 3600, None, "full"), "sidekiq": preset("sidekiq")}

    def once(name: str, _round: int) -> trials.Run:
        policy = policies[name]
        start = time.perf_counter()
        delays = [policy.delay(1 + i % 20) for i in range(events)]
        elapsed = time.perf_counter() - start
        ok = sum(1 for d in delays if d >= 0)
        return trials.Run(elapsed, ok, [] if ok == events else [f"{events - ok} negative delays"])

    results = trials.interleaved(list(policies), repeat, once, label="library / ")
    return trials.table(results, baseline=None, unit="delay() calls", labels={k: f"`{k}.delay(n)`" for k in policies})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rate", type=float, default=50.0, help="calls per second the token bucket lets through")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (the modes' order rotates each round)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that `finally` stops the moto server
    print(trials.machine_line("retry.py"), flush=True)
    labels = {
        "baseline": "baseline: retry at once",
        "policy": "policy: `retry_call`, exponential 10 ms x2 (max 1 s), full jitter",
    }
    proc, endpoint = start_moto()
    try:
        env = deploy(
            boto3.client(
                "cloudformation",
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id="bench",
                aws_secret_access_key="bench",
            ),
            stack_name="bench-retry",
        )
        table = env["AGENDA_READY_TABLE"]
        print(f"\nScenario 1: {args.items} PutItem over {args.threads} threads, throttled above {args.rate:g} calls/s "
              "(verified: every item read back)")  # fmt: skip

        def one_run(mode, _round):
            return throttling(endpoint, table, args.items, args.threads, args.rate, mode)

        one = trials.interleaved(["baseline", "policy"], args.repeat, one_run, label="throttled / ")
        print("\n".join(trials.table(one, baseline="baseline", unit="items", labels=labels)))
        for mode, runs in one.items():
            per = sorted({round(r.extra["throttled"] / args.items, 2) for r in runs})
            print(f"- {labels[mode]}: throttled calls per item {', '.join(f'{x:.2f}' for x in per)}")
        n = args.items // 4
        print(f"\nScenario 2: {n} PutItem refused with ValidationException (verified: every one failed, as permanent)")
        labels2 = {
            "baseline": "baseline: retry every error 5 times",
            "policy": "policy: `retry_call` (permanent: no retry)",
        }
        two = trials.interleaved(
            ["baseline", "policy"],
            args.repeat,
            lambda mode, _r: permanent(endpoint, table, n, mode),
            label="permanent / ",
        )
        print("\n".join(trials.table(two, baseline="baseline", unit="items", labels=labels2)))
    finally:
        moto_server.stop(proc)

    print(f"\nScenario 3: the pure library ({args.events} operations per run)")
    print("\n".join(library(args.events, args.repeat)))
    print(trials.after_line())
    return 0 if trials.all_ok(one, two) else 1


if __name__ == "__main__":
    raise SystemExit(main())
