"""Enqueue from SQL through psycopg (docs/src/sql-enqueue.md), against a real
`jobq serve --store postgres://…`: the book's example commits an order and
its job together; a rolled-back transaction leaves neither; a bad call is
an SQL error naming what is wrong.

Needs a PostgreSQL cluster (JOBQ_TEST_PG; `scripts/pg-test.sh` starts one)
and psycopg 3:

    scripts/pg-test.sh .venv/bin/python clients/python/tests/sql_test.py

Prints `python-sql: N passed, M failed`.
"""

import json
import os
import secrets
import sys
import tempfile
import time
from typing import Callable, List

import psycopg

from harness import EXAMPLES, Server
from jobq import Client, Status

sys.path.insert(0, EXAMPLES)
from sql_enqueue import place_order  # noqa: E402


def commit_makes_the_job(client: Client, url: str) -> None:
    with psycopg.connect(url) as conn:
        job_id = place_order(conn, "order-4711")
    job = client.get_job(str(job_id))
    assert job.status == Status.PENDING, job
    assert job.key == "order-4711" and job.kind == "send-email", job
    assert json.loads(job.payload) == {"order": "order-4711", "to": "ada@example.com"}
    assert job.max_attempts == 5, job


def rollback_leaves_nothing(client: Client, url: str) -> None:
    with psycopg.connect(url) as conn:
        try:
            with conn.transaction():
                conn.execute("INSERT INTO orders (id) VALUES ('order-4712')")
                conn.execute("SELECT jobq_enqueue('emails', 'send-email', key => 'order-4712')")
                raise RuntimeError("the payment was declined")
        except RuntimeError:
            pass
        assert conn.execute("SELECT count(*) FROM orders WHERE id = 'order-4712'").fetchone() == (0,)
    assert not list(client.list_jobs("emails", key="order-4712"))


def bad_input_is_an_sql_error(client: Client, url: str) -> None:
    with psycopg.connect(url) as conn:
        try:
            conn.execute("SELECT jobq_enqueue('emails', 'send email')")
        except psycopg.errors.InvalidParameterValue as e:
            assert 'kind contains " "' in str(e), str(e)
        else:
            raise AssertionError("a kind with a space was accepted")


def main() -> int:
    cluster = os.environ.get("JOBQ_TEST_PG")
    if not cluster:
        print("JOBQ_TEST_PG is not set: run under scripts/pg-test.sh", file=sys.stderr)
        return 1
    name = f"jobq_py_sql_{secrets.token_hex(6)}"
    with psycopg.connect(cluster, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    base, _, query = cluster.partition("?")
    url = base.rsplit("/", 1)[0] + "/" + name + (("?" + query) if query else "")
    tests: List[Callable[[Client, str], None]] = [
        commit_makes_the_job, rollback_leaves_nothing, bad_input_is_an_sql_error]
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="jobq-py-sql-") as tmp:
        server = Server(tmp, "--store", url)
        try:
            with Client(server.url) as client, psycopg.connect(url) as conn:
                client.wait_ready()
                conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
                conn.commit()
                for test in tests:
                    t0 = time.monotonic()
                    try:
                        test(client, url)
                        passed += 1
                        print(f"ok   {test.__name__} ({time.monotonic() - t0:.2f}s)")
                    except Exception as e:  # noqa: BLE001
                        failed += 1
                        print(f"FAIL {test.__name__}: {e!r}")
        finally:
            server.stop()
    print(f"python-sql: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
