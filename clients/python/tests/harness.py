"""What the Python tests share: a real `jobq serve` on a free port, worker
processes, condition waits, and a tiny runner. A test that needs the server
fails loudly when it cannot start one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, List, Optional, Tuple

from jobq import pb

HERE = os.path.dirname(os.path.abspath(__file__))
PYCLIENT = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(PYCLIENT))
JOBQ_BIN = os.environ.get("JOBQ_BIN", os.path.join(ROOT, "target", "debug", "jobq"))
EXAMPLES = os.path.join(PYCLIENT, "examples")


class Server:
    """A `jobq serve` with its own data folder, on a free port (or `listen`).
    restart() brings it back on the same port and data."""

    def __init__(self, tmp: str, *extra: str, name: str = "server",
                 listen: str = "127.0.0.1:0") -> None:
        self.tmp, self.extra, self.name = tmp, extra, name
        self.data = os.path.join(tmp, f"{name}-data")
        self.starts = 0
        self._start(listen)

    def _start(self, listen: str) -> None:
        if not os.path.exists(JOBQ_BIN):
            raise RuntimeError(f"no server binary at {JOBQ_BIN}: run `cargo build -p jobq-cli`")
        self.starts += 1
        self.log_path = os.path.join(self.tmp, f"{self.name}-{self.starts}.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [JOBQ_BIN, "serve", "--listen", listen, "--http-listen", "127.0.0.1:0",
             "--data", self.data, *self.extra],
            stdout=self.log, stderr=self.log,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"jobq serving addr=(\S+)", open(self.log_path).read())
            if m:
                self.addr = m.group(1)
                self.url = "http://" + self.addr
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("jobq serve did not start:\n" + open(self.log_path).read())

    def kill(self) -> None:
        """SIGKILL: no graceful anything."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()

    def restart(self) -> None:
        """Starts again on the same address and data folder (after kill())."""
        deadline = time.monotonic() + 20
        while True:  # the port may take a moment to be free again
            try:
                self._start(self.addr)
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_worker(tmp: str, addr: str, name: str, *extra: str,
                 env: Optional[dict] = None,
                 script: str = "worker.py") -> Tuple[subprocess.Popen, str]:
    log = os.path.join(tmp, f"{name}.jobs")
    out = open(os.path.join(tmp, f"{name}.out"), "w")
    args = [sys.executable, os.path.join(EXAMPLES, script), "--worker-id", name,
            "--log", log, *extra]
    if addr:
        args[2:2] = ["--server", addr]
    proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                            env=env if env is not None else os.environ.copy())
    return proc, log


def lines(path: str) -> List[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def outcomes(job: pb.Job) -> List[str]:
    return [pb.AttemptOutcome.Name(a.outcome) for a in job.history]


def run_tests(label: str, tests: List[Callable[..., None]]) -> int:
    """Runs each test(tmp, client, addr) against one shared server; prints
    `<label>: N passed, M failed`; returns the exit code."""
    from jobq import Client

    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix=f"jobq-{label}-") as tmp:
        server = Server(tmp)
        client = Client(server.url)
        try:
            client.wait_ready()
            for test in tests:
                t0 = time.monotonic()
                try:
                    test(tmp, client, server.addr)
                except Exception:  # noqa: BLE001
                    failed += 1
                    print(f"FAIL {test.__name__} ({time.monotonic() - t0:.1f}s)", flush=True)
                    traceback.print_exc()
                    for name in sorted(os.listdir(tmp)):
                        if name.endswith(".out"):
                            print(f"--- {name}:\n" + open(os.path.join(tmp, name)).read()[-3000:])
                else:
                    passed += 1
                    print(f"ok   {test.__name__} ({time.monotonic() - t0:.1f}s)", flush=True)
        finally:
            client.close()
            server.stop()
            if failed:
                print("--- server log (tail):\n" + open(server.log_path).read()[-3000:])
    print(f"{label}: {passed} passed, {failed} failed")
    return 1 if failed else 0
