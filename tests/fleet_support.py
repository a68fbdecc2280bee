"""Helpers for the fleet tests: fleet state in moto, queue contents, metric sums, a drain run."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import logging
import select
import socket
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

from botocore.exceptions import ClientError

from pipelines.common import iso, to_item
from pipelines.common.task import TaskRun
from pipelines.fleet import messages
from pipelines.fleet.context import FleetContext
from pipelines.fleet.drain import TerminationLimits, queue_drain
from pipelines.fleet.termination import TerminationHandler
from tests.conftest import PATIENCE

log = logging.getLogger("tests.fleet")
AMI = "ami-12c6146b"


def context(aws) -> FleetContext:
    return FleetContext(
        ec2=aws.client("ec2"),
        ssm=aws.client("ssm"),
        dynamodb=aws.client("dynamodb"),
        cloudwatch=aws.client("cloudwatch"),
        s3=aws.client("s3"),
        jobs_table=aws.env["RUNS_FLEET_JOBS_TABLE"],
        archive_bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"],
        namespace="RunsFleet",
        log=log,
    )


def make_drain(aws, *, run_id: str | None = None, dlq_url: str | None = None, **limits):
    """A termination drain over the test's clients (``wait_seconds`` 0 unless given)."""
    limits.setdefault("wait_seconds", 0)
    return queue_drain(
        TerminationHandler,
        context(aws),
        sqs=aws.client("sqs"),
        queue_url=aws.env["RUNS_FLEET_TERMINATION_QUEUE_URL"],
        dlq_url=dlq_url or aws.env["RUNS_FLEET_TERMINATION_DLQ_URL"],
        run_id=run_id or uuid.uuid4().hex[:8],
        limits=TerminationLimits(**limits),
    )


def drain(aws, *, run_id: str | None = None, dlq_url: str | None = None, **limits):
    return make_drain(aws, run_id=run_id, dlq_url=dlq_url, **limits).run()


def redrive_run(aws, *, dlq_url: str | None = None, source_url: str | None = None) -> TaskRun:
    """The dead-letter redrive's ``TaskRun`` over the test's clients (default: the termination queues)."""
    fleet = SimpleNamespace(
        termination_dlq_url=dlq_url or aws.env["RUNS_FLEET_TERMINATION_DLQ_URL"],
        termination_queue_url=source_url or aws.env["RUNS_FLEET_TERMINATION_QUEUE_URL"],
        archive_bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"],
    )
    return TaskRun(log, "", {"sqs": aws.client("sqs"), "s3": aws.client("s3"), "fleet": fleet})


def past_stale_ssm_grace(monkeypatch) -> None:
    """The fleet's clock 11 minutes on: a runner parameter written now is past ``stale_ssm``'s 10-minute
    grace for an instance EC2 does not describe."""
    at = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=11)
    monkeypatch.setattr(messages, "utcnow", lambda: at)


def start_jobs(aws, n: int, *, tag_managed: bool = True) -> list[dict]:
    """n running instances, each with a running job and its runner parameter."""
    ec2, ddb, ssm = aws.client("ec2"), aws.client("dynamodb"), aws.client("ssm")
    tags = [{"Key": "runs-fleet:managed", "Value": "true"}, {"Key": "runs-fleet:pool", "Value": "linux-small"}]
    instances = ec2.run_instances(
        ImageId=AMI,
        MinCount=n,
        MaxCount=n,
        InstanceType="t3.small",
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags if tag_managed else tags[1:]}],
    )["Instances"]
    jobs = []
    table = aws.env["RUNS_FLEET_JOBS_TABLE"]
    for k, inst in enumerate(instances):
        job = {
            "job_id": f"job-{uuid.uuid4().hex[:10]}-{k}",
            "instance_id": inst["InstanceId"],
            "pool": "linux-small",
            "status": "running",
            "started_at": iso(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)),
        }
        ssm.put_parameter(Name=f"/runs-fleet/runners/{inst['InstanceId']}/config", Type="String", Value="{}")
        jobs.append(job)
    for start in range(0, len(jobs), 25):
        ddb.batch_write_item(
            RequestItems={table: [{"PutRequest": {"Item": to_item(job)}} for job in jobs[start : start + 25]]}
        )
    return jobs


def termination_body(job: dict, status: str = "success", **extra) -> str:
    now = dt.datetime.now(dt.UTC)
    body = {
        "instance_id": job["instance_id"],
        "job_id": job["job_id"],
        "status": status,
        "exit_code": 0 if status == "success" else 1,
        "duration_seconds": 120,
        "started_at": iso(now - dt.timedelta(minutes=2)),
        "completed_at": iso(now),
        "error": "" if status == "success" else "exit code 1",
    }
    body.update(extra)
    return json.dumps(body)


def send(aws, bodies: list[str], queue_env: str = "RUNS_FLEET_TERMINATION_QUEUE_URL") -> None:
    sqs = aws.client("sqs")
    for start in range(0, len(bodies), 10):
        sqs.send_message_batch(
            QueueUrl=aws.env[queue_env],
            Entries=[{"Id": str(n), "MessageBody": b} for n, b in enumerate(bodies[start : start + 10])],
        )


def read_all(aws, queue_env: str, visibility: int = 60) -> list[dict]:
    sqs, out = aws.client("sqs"), []
    while True:
        got = sqs.receive_message(
            QueueUrl=aws.env[queue_env],
            MaxNumberOfMessages=10,
            VisibilityTimeout=visibility,
            MessageAttributeNames=["All"],
            AttributeNames=["All"],
        ).get("Messages", [])
        if not got:
            return out
        out += got


def depth(aws, queue_env: str) -> int:
    attrs = aws.client("sqs").get_queue_attributes(
        QueueUrl=aws.env[queue_env],
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


def jobs_state(aws) -> dict[str, dict]:
    from pipelines.common import from_item

    items = aws.client("dynamodb").scan(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"])["Items"]
    return {i["job_id"]["S"]: from_item(i) for i in items}


def metric_sum(aws, name: str, dimensions: list[dict] | None = None) -> float:
    now = dt.datetime.now(dt.UTC)
    points = aws.client("cloudwatch").get_metric_statistics(
        Namespace="RunsFleet",
        MetricName=name,
        Dimensions=dimensions or [],
        StartTime=now - dt.timedelta(hours=1),
        EndTime=now + dt.timedelta(hours=1),
        Period=3600 * 2,
        Statistics=["Sum", "SampleCount"],
    )["Datapoints"]
    return sum(p["Sum"] for p in points)


def runner_parameters(aws) -> set[str]:
    names = set()
    for page in (
        aws.client("ssm").get_paginator("get_parameters_by_path").paginate(Path="/runs-fleet/runners", Recursive=True)
    ):
        names |= {p["Name"] for p in page["Parameters"]}
    return names


def jobs_done(aws) -> int:
    """How many jobs are no longer running."""
    return sum(1 for j in jobs_state(aws).values() if j["status"] != "running")


def wait_until_completed(aws, at_least: int, still_running, timeout: float = PATIENCE) -> None:
    """Wait until ``at_least`` jobs are no longer running; ``still_running()`` must stay true meanwhile
    (the run under test must not end before the test stops it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if jobs_done(aws) >= at_least:
            return
        assert still_running(), "the run ended before it could be stopped"
        time.sleep(0.05)
    raise AssertionError("the drain run did not get going")


def wait_until_visible(aws, queue_env: str, timeout: float = PATIENCE) -> None:
    """Wait until no message of the queue is in flight: what a stopped run received but did not
    acknowledge is visible again once its visibility timeout has run out."""
    deadline = time.monotonic() + timeout
    sqs = aws.client("sqs")
    while time.monotonic() < deadline:
        attrs = sqs.get_queue_attributes(
            QueueUrl=aws.env[queue_env], AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        if int(attrs["ApproximateNumberOfMessagesNotVisible"]) == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"messages of {queue_env} stayed in flight for {timeout}s")


def rounds_done(aws) -> set[str]:
    """The termination rounds marked done (their S3 markers), in one listing."""
    from pipelines.fleet.termination import ROUNDS_PREFIX

    s3, bucket = aws.client("s3"), aws.env["RUNS_FLEET_ARCHIVE_BUCKET"]
    keys = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=ROUNDS_PREFIX):
        keys |= {obj["Key"] for obj in page.get("Contents", [])}
    return keys


def round_done(aws, job_item: dict, done: set[str] | None = None) -> bool:
    """Is the round that applied this job marked done (its S3 marker exists)?"""
    from pipelines.fleet.termination import round_marker_key

    round_id = job_item.get("termination_round")
    if not round_id:
        return False
    key = round_marker_key(aws.env["RUNS_FLEET_TERMINATION_QUEUE_URL"], round_id)
    if done is not None:
        return key in done
    listed = aws.client("s3").list_objects_v2(Bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"], Prefix=key)
    return listed.get("KeyCount", 0) == 1


@contextmanager
def refused(client, operation: str, code: str, message: str, when: Callable[[dict], bool]) -> Iterator[None]:
    """Within the block, ``operation`` fails with ``code`` whenever ``when(params)`` holds: AWS's own
    checks that moto does not make, or one bad item's refusal."""
    event = f"provide-client-params.{client.meta.service_model.service_name}.{operation}"

    def hook(params, **kwargs):
        if when(params):
            raise ClientError({"Error": {"Code": code, "Message": message}}, operation)

    client.meta.events.register(event, hook)
    try:
        yield
    finally:
        client.meta.events.unregister(event, hook)


def client_gone(sock: socket.socket) -> bool:
    """Whether the client of a server's connection has closed it (it gave up, or its process died)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and not sock.recv(1, socket.MSG_PEEK)
    except OSError:
        return True


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class ReceiveHold:
    """Holds a drain run in a subprocess at a round boundary until the test has stopped it.

    An HTTP proxy to moto (give the run ``AWS_ENDPOINT_URL`` = :attr:`endpoint`) that forwards every
    request, except that the first SQS ``ReceiveMessage`` sent once ``until()`` is true waits until
    :meth:`release` (or the end of the block). A drain receives only between rounds, so while it is
    held (:meth:`wait_held`) what it has done is fixed: the test terminates or signals the run there,
    whatever the machine's speed, and then releases it. :meth:`hold` sets another hold (another
    request, another condition) on the same proxy; a held request whose client has gone meanwhile
    (a killed process) is not forwarded."""

    def __init__(self, upstream: str, until: Callable[[], bool] = lambda: False) -> None:
        self._upstream = urllib.parse.urlsplit(upstream).netloc
        self._lock = threading.Lock()
        self.seen: Counter[str] = Counter()  # requests answered since the hold was set, by X-Amz-Target
        self._released = threading.Event()
        self.hold(until)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ReceiveHold:
        threading.Thread(target=self._server.serve_forever, name="receive-hold", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def hold(self, until: Callable[[], bool], target: str = "AmazonSQS.ReceiveMessage", naming: str = "") -> None:
        """From now on hold the first ``target`` request whose body names ``naming`` sent once ``until()``
        is true (an earlier hold is released)."""
        with self._lock:
            self._released.set()
            self._until, self._target, self._naming = until, target, naming.encode()
            self._held, self._released = threading.Event(), threading.Event()
            self.seen.clear()

    @property
    def held(self) -> bool:
        return self._held.is_set()

    def wait_held(self, still_running: Callable[[], bool], timeout: float = PATIENCE) -> None:
        """Until the run is held; ``still_running()`` must stay true meanwhile."""
        deadline = time.monotonic() + timeout
        while not self._held.wait(0.05):
            assert still_running(), "the run ended before it could be held"
            assert time.monotonic() < deadline, "the drain run did not get going"

    def release(self) -> None:
        self._released.set()

    def _hold(self, target: str, body: bytes) -> bool:
        """Whether this request was held."""
        with self._lock:
            held, released = self._held, self._released
            if target != self._target or released.is_set() or held.is_set() or self._naming not in body:
                return False
            if not self._until():
                return False
            held.set()
        released.wait()
        return True

    def _answered(self, target: str) -> None:
        with self._lock:
            self.seen[target] += 1

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hold = self

        class Forward(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive and Expect: 100-continue, as boto3 uses them

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target", "")
                if hold._hold(target, body) and client_gone(self.connection):
                    self.close_connection = True
                    return
                upstream = http.client.HTTPConnection(hold._upstream, timeout=300)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("expect", "connection")}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                finally:
                    upstream.close()
                hold._answered(target)
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

            def log_message(self, *args) -> None:  # quiet
                pass

        return Forward
