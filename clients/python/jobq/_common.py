"""What the sync and asyncio clients share: the server URL, credentials,
channel options, request builders, errors and the retry backoff."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import random
from datetime import datetime, timedelta, timezone
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import grpc
from google.protobuf import duration_pb2

from jobq import _trace
from jobq.errors import Fatal as Fatal, JobLost as JobLost, Retry as Retry  # re-exported
from jobq.models import NewJob, QueueStats, RateLimit
from jobq.v1 import jobq_pb2 as pb

Seconds = Union[int, float, timedelta]
#: A JobStatus number or name ("DONE" or "JOB_STATUS_DONE").
StatusLike = Union[int, str]
#: Call metadata as gRPC takes it.
Metadata = Tuple[Tuple[str, str], ...]

#: The server the CLI talks to by default; also $JOBQ_SERVER.
DEFAULT_SERVER = "http://127.0.0.1:50051"

#: Most leases in one Heartbeat call: the server refuses more (the Rust
#: client's jobq::MAX_HEARTBEAT_LEASES); heartbeat() splits.
MAX_HEARTBEAT_LEASES = 1000

#: The longest progress message the server takes by default
#: (--max-progress-message-bytes): ctx.progress() cuts a longer one.
PROGRESS_MESSAGE_BYTES = 256

#: A progress report: (percent, message).
Report = Tuple[int, str]

#: The largest reply decoded (64 MiB, above the server's default
#: --max-message-bytes of 16 MiB): a page of big jobs, or one job with a long
#: history, is over gRPC's 4 MiB default.
MAX_RECEIVE_BYTES = 64 * 1024 * 1024

#: Codes that mean "the server did not get to decide" (down, restarting, the
#: connection dropped), as opposed to a decision such as ABORTED.
TRANSIENT_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
})

#: JobStatus number -> short name ("PENDING", "RUNNING", "DONE", "FAILED").
STATUS_NAMES: Dict[int, str] = {
    v.number: v.name.replace("JOB_STATUS_", "")
    for v in pb.JobStatus.DESCRIPTOR.values
}


def result_bytes(value: object) -> bytes:
    """A handler's return value as the job's result: None is none, bytes
    as they are, a str as UTF-8, anything else as JSON (a TypeError when
    it is not JSON-serializable)."""
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()


def result_or_none(value: object, job_id: str) -> bytes:
    """``result_bytes``, except that a value with no JSON form (a handler
    that returns a response object by accident) is logged and the job acked
    without a result: its work is done, and failing it would run it again."""
    try:
        return result_bytes(value)
    except (TypeError, ValueError) as e:
        logging.getLogger("jobq").warning(
            "job %s: the handler's return value has no JSON form (%s); acking without a "
            "result", job_id, e)
        return b""


def duration(value: Optional[Seconds]) -> Optional[duration_pb2.Duration]:
    if value is None:
        return None
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(seconds(value) * 1e9)))
    return d


def lease_deadline(leased: "pb.LeasedJob", lease: float, now: float) -> float:
    """When a pushed lease runs out, on this machine's clock (as heartbeats
    extend it): the lease's length from the server's two timestamps (both on
    its clock), counted from ``now``; the server's expiry itself would carry
    any clock skew. ``lease`` (the length asked for) when they are missing."""
    granted = lease
    if leased.HasField("lease_expires_at") and leased.job.HasField("taken_at"):
        span = (leased.lease_expires_at.ToNanoseconds()
                - leased.job.taken_at.ToNanoseconds()) / 1e9
        if span > 0:
            granted = span
    return now + granted


def seconds(value: Seconds) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def status_value(status: StatusLike) -> "pb.JobStatus.ValueType":
    if isinstance(status, str):
        name = status if status.startswith("JOB_STATUS_") else "JOB_STATUS_" + status.upper()
        return pb.JobStatus.Value(name)
    return pb.JobStatus.ValueType(status)


def check_queues(queues: object) -> List[str]:
    """A list of queue names; a bare string is refused (it would otherwise
    be read as one queue per character)."""
    if isinstance(queues, (str, bytes)):
        raise TypeError(
            f"queues must be a list or tuple of queue names, not a bare string: "
            f"write [{queues!r}]"
        )
    if not isinstance(queues, (list, tuple)) or not all(isinstance(q, str) for q in queues):
        raise TypeError(f"queues must be a list or tuple of str, got {queues!r}")
    if not queues:
        raise ValueError("queues must name at least one queue")
    return list(queues)


def parse_server(server: Optional[str]) -> Tuple[str, bool]:
    """(host:port, tls) from a URL as the CLI takes it: `http://host:port`,
    `https://host:port`, or a bare `host:port` (plaintext). None reads
    $JOBQ_SERVER, then the default http://127.0.0.1:50051. Without a port,
    the scheme's: 80 for http (and a bare host), 443 for https, as the Rust
    client and the CLI (gRPC's own default would be 443 for both)."""
    url = server if server is not None else os.environ.get("JOBQ_SERVER") or DEFAULT_SERVER
    url = url.strip()
    tls = False
    if url.startswith("https://"):
        rest, tls = url[len("https://"):], True
    elif url.startswith("http://"):
        rest = url[len("http://"):]
    elif "://" in url:
        raise ValueError(f"jobq server {url!r}: the scheme must be http:// or https://")
    else:
        rest = url
    rest = rest.rstrip("/")
    if not rest or "/" in rest:
        raise ValueError(f"jobq server {url!r}: expected http://host:port or https://host:port")
    # `[::1]:50051` has a port; `[::1]` and `host` do not.
    has_port = "]:" in rest if rest.startswith("[") else ":" in rest
    if not has_port:
        rest += ":443" if tls else ":80"
    return rest, tls


def auth_metadata(token: Optional[str]) -> Metadata:
    """`authorization: Bearer <token>`; None reads $JOBQ_TOKEN (as the CLI does)."""
    if token is None:
        token = os.environ.get("JOBQ_TOKEN")
    if not token or not token.strip():
        return ()
    return (("authorization", f"Bearer {token.strip()}"),)


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z).
    Any other name is not, even one that resolves to a loopback address:
    what it resolves to can change."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def check_plaintext_token(target: str, auth: Metadata, insecure: bool) -> None:
    """Refuses, before any channel exists, a token that would travel in
    clear to another machine: `target` (host:port) is reached over
    plaintext, is not this machine, and the caller did not say
    insecure=True."""
    if not auth or insecure:
        return
    host = target[: target.index("]") + 1] if target.startswith("[") else target.rsplit(":", 1)[0]
    if not is_loopback(host):
        raise ValueError(
            f"refusing to send the token in clear to {host}: the connection is plaintext "
            f"and {host} is not this machine; use https://, or pass insecure=True")


def channel_options() -> List[Tuple[str, int]]:
    return [
        # Keepalive pings let both sides find a silent peer (the server
        # reclaims a dead worker's jobs when its stream drops).
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
        # Reconnect as the Rust client does (100 ms doubling to 5 s), so a
        # restarted server is found again within seconds, not minutes.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 5_000),
    ]


def credentials(
    tls: bool,
    root_certificates: Optional[bytes],
    certificate_chain: Optional[bytes],
    private_key: Optional[bytes],
) -> Optional[grpc.ChannelCredentials]:
    """TLS credentials, or None for plaintext. Any certificate turns TLS on;
    without root_certificates, $JOBQ_CA_CERT (a PEM path) or the system's
    roots are trusted."""
    if root_certificates is None and (tls or certificate_chain or private_key):
        ca = os.environ.get("JOBQ_CA_CERT")
        if ca:
            with open(ca, "rb") as f:
                root_certificates = f.read()
    if not (tls or root_certificates or certificate_chain or private_key):
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=root_certificates,
        private_key=private_key,
        certificate_chain=certificate_chain,
    )


class Backoff:
    """Jittered exponential backoff, 100 ms doubling to 5 s (the Rust client's)."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self._first, self._cap, self._next = first, cap, first

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self._cap)
        return delay * (0.5 + random.random() / 2)

    def reset(self) -> None:
        self._next = self._first


# -- request builders (one place for both clients) -------------------------

def enqueue_request(
    queue: str, kind: str, payload: Union[bytes, str], key: Optional[str], max_attempts: int,
    delay: Optional[Seconds], metadata: Optional[Mapping[str, str]], priority: int = 0,
    run_at: Optional[datetime] = None, group: Optional[str] = None,
    max_snoozes: Optional[int] = None,
    key_scope: Optional[str] = None, on_conflict: Optional[str] = None,
    unique_for: Optional[Seconds] = None,
) -> pb.EnqueueRequest:
    if isinstance(payload, str):
        payload = payload.encode()
    if run_at is not None:
        if delay is not None:
            raise ValueError("give delay= or run_at=, not both")
        if run_at.tzinfo is None:
            raise ValueError("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
        delay = max(0.0, (run_at - datetime.now(timezone.utc)).total_seconds())
    req = pb.EnqueueRequest(
        queue=queue, kind=kind, payload=payload, key=key or "",
        max_attempts=max_attempts, delay=duration(delay),
        metadata=_trace.with_trace_context(metadata), group=group or "",
        key_scope=_named("key_scope", key_scope, _KEY_SCOPES),
        on_conflict=_named("on_conflict", on_conflict, _ON_CONFLICTS),
        unique_for=duration(unique_for),
    )
    if max_snoozes is not None:
        req.max_snoozes = max_snoozes
    if priority:
        # EnqueueRequest.priority (-100..=100, higher first) exists once the
        # proto this package was built from has it.
        if "priority" not in pb.EnqueueRequest.DESCRIPTOR.fields_by_name:
            raise ValueError("priority: this jobq-client was built from a proto without "
                             "EnqueueRequest.priority; reinstall it from a newer checkout")
        setattr(req, "priority", priority)
    return req


_Wire = TypeVar("_Wire")

# ``key_scope=``: which jobs hold a key; ``on_conflict=``: what an enqueue
# does with a PENDING one that holds it.
_KEY_SCOPES = {None: pb.KEY_SCOPE_UNSPECIFIED, "retained": pb.KEY_SCOPE_RETAINED,
               "active": pb.KEY_SCOPE_ACTIVE}
_ON_CONFLICTS = {None: pb.ON_CONFLICT_UNSPECIFIED, "keep": pb.ON_CONFLICT_KEEP,
                 "replace": pb.ON_CONFLICT_REPLACE}


def _named(keyword: str, value: Optional[str], names: Mapping[Optional[str], _Wire]) -> _Wire:
    """The wire value of a keyword given by name; ValueError for another."""
    if value not in names:
        expected = " or ".join(repr(n) for n in names if n is not None)
        raise ValueError(f"{keyword} {value!r}: expected {expected}")
    return names[value]


def batch_request(jobs: Sequence[Union[NewJob, pb.EnqueueRequest]]) -> pb.EnqueueBatchRequest:
    """NewJobs (or ready EnqueueRequests) as one EnqueueBatch."""
    reqs = [
        j if isinstance(j, pb.EnqueueRequest) else enqueue_request(
            j.queue, j.kind, j.payload, j.key, j.max_attempts, j.delay, j.metadata,
            j.priority, j.run_at, j.group, j.max_snoozes, j.key_scope, j.on_conflict,
            j.unique_for)
        for j in jobs
    ]
    return pb.EnqueueBatchRequest(jobs=reqs)


def fail_request(
    job_id: str, lease_id: str, error: str, retry_delay: Optional[Seconds], fatal: bool,
    snooze: Optional[Seconds] = None,
) -> pb.FailRequest:
    return pb.FailRequest(
        job_id=job_id, lease_id=lease_id, error=error,
        retry_delay=duration(retry_delay), fatal=fatal, snooze=duration(snooze),
    )


def heartbeat_requests(
    worker_id: str, leases: Sequence[Tuple[str, str]], extend_by: Optional[Seconds],
    draining: bool, stream_token: str, progress: Optional[Mapping[str, Report]] = None,
) -> List[pb.HeartbeatRequest]:
    """One request per MAX_HEARTBEAT_LEASES leases (at least one), each
    lease with the progress reported for its job in ``progress``."""
    leases = list(leases)
    reports = progress or {}
    chunks = [leases[i:i + MAX_HEARTBEAT_LEASES]
              for i in range(0, len(leases), MAX_HEARTBEAT_LEASES)] or [[]]

    def ref(j: str, lid: str) -> pb.LeaseRef:
        r = reports.get(j)
        if r is None:
            return pb.LeaseRef(job_id=j, lease_id=lid)
        return pb.LeaseRef(job_id=j, lease_id=lid,
                           progress=pb.Progress(percent=r[0], message=r[1]))
    return [
        pb.HeartbeatRequest(
            worker_id=worker_id,
            leases=[ref(j, lid) for j, lid in chunk],
            extend_by=duration(extend_by), draining=draining, stream_token=stream_token,
        )
        for chunk in chunks
    ]


def report(percent: int, message: str) -> Report:
    """A progress report as sent: percent within 0..100, the message cut
    to PROGRESS_MESSAGE_BYTES bytes of UTF-8 at a character boundary."""
    data = message.encode("utf-8")[:PROGRESS_MESSAGE_BYTES]
    return (max(0, min(100, int(percent))), data.decode("utf-8", errors="ignore"))


def purge_request(queue: str, status: StatusLike,
                  finished_before: Union[float, datetime, None]) -> pb.PurgeJobsRequest:
    req = pb.PurgeJobsRequest(queue=queue, status=status_value(status))
    if isinstance(finished_before, datetime):
        if finished_before.tzinfo is None:
            raise ValueError("finished_before must be timezone-aware")
        finished_before = finished_before.timestamp()
    if finished_before is not None:
        req.finished_before.FromNanoseconds(int(finished_before * 1e9))
    return req


def schedule_request(name: str, queue: str, kind: str, payload: Union[bytes, str],
                     cron: str, timezone: str, max_attempts: int) -> pb.CreateScheduleRequest:
    if isinstance(payload, str):
        payload = payload.encode()
    return pb.CreateScheduleRequest(name=name, queue=queue, kind=kind, payload=payload,
                                    cron=cron, timezone=timezone, max_attempts=max_attempts)


def policy_request(queue: str, max_running: int, group_max_running: int,
                   rate: Optional[RateLimit], group_rate: Optional[RateLimit] = None,
                   ) -> pb.SetQueuePolicyRequest:
    policy = pb.QueuePolicy(max_running=max_running, group_max_running=group_max_running)
    for field, value in (("rate", rate), ("group_rate", group_rate)):
        if value is not None:
            r = getattr(policy, field)
            r.limit = value.limit
            r.per.FromTimedelta(value.per)
            r.burst = value.burst
    return pb.SetQueuePolicyRequest(queue=queue, policy=policy)


def stats_of(resp: pb.StatsResponse) -> Dict[str, QueueStats]:
    return {q.queue: QueueStats.from_pb(q) for q in resp.queues}


def revoke_reason(reason: str) -> str:
    """A `revoked` event's reason as the handler is told it. An operator's
    CancelJob arrives as "revoked (cancelled: <why>)": that reads
    "cancelled: <why>", the operator's words after one prefix, as the
    job's last_error has them. Any other reason ("lease expired", a lease
    moved to another stream) reads "revoked: <reason>"."""
    reason = reason.strip()
    inner = reason
    if reason.startswith("revoked (") and reason.endswith(")"):
        inner = reason[len("revoked ("):-1]
    elif reason == "revoked" or not reason:
        return "revoked"
    if inner == "cancelled" or inner.startswith("cancelled: "):
        return inner
    return f"revoked: {inner}"


def error_text(error: BaseException) -> str:
    """``Type: message`` for a Fail; never raises. A message that cannot be
    read (a broken ``__str__``) is left out, and one that is not valid
    UTF-8 (a lone surrogate, say from a file name) is escaped, since the
    request could not carry it."""
    name = type(error).__name__
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - the handler's error, not ours
        return f"{name} (its message could not be read)"
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return f"{name}: {text}" if text else name


#: Status codes with which a Lease call will never succeed as sent: the
#: worker gives up on the first stream rather than retrying (the Rust
#: client's ``refused_for_good``).
REFUSED_FOR_GOOD = frozenset({
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNIMPLEMENTED,
})


def check_worker_settings(capacity: int, lease: float, heartbeat_every: float,
                          drain_timeout: float) -> None:
    """Refuses settings with which no job could ever be acked (as the Rust
    WorkerBuilder does)."""
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1, not {capacity}")
    if lease <= 0:
        raise ValueError(f"lease must be positive, not {lease}")
    if not 0 < heartbeat_every < lease:
        raise ValueError(f"heartbeat_every ({heartbeat_every}s) must be positive and "
                         f"shorter than the lease ({lease}s), or every lease runs out "
                         "before its first heartbeat")
    if drain_timeout < 0:
        raise ValueError(f"drain_timeout must not be negative, not {drain_timeout}")
