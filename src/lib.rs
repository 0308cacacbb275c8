//! The jobq wire contract.
//!
//! Layout:
//! - [`pb`]: the Rust code generated from `proto/jobq/v1/jobq.proto`
//!   (messages, the `JobQueue` client and server traits). Nothing
//!   hand-written lives next to it; domain types and conversions are in
//!   `jobq-server`.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptor set, for gRPC server
//!   reflection and for tools that need the schema at run time.
//! - The limits client and server share: [`MAX_HEARTBEAT_LEASES`],
//!   [`MAX_DECODE_BYTES`], [`PROGRESS_MESSAGE_BYTES`]; and [`code_name`],
//!   how status codes are written.
#![warn(missing_docs)]

/// Generated protobuf messages and gRPC stubs for package `jobq.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("jobq.v1");
}

/// The encoded `google.protobuf.FileDescriptorSet` of `jobq/v1/jobq.proto`
/// and its imports.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/jobq_descriptor.bin"));

/// The response header of a `Lease` stream that carries its token; a
/// worker presents it in `HeartbeatRequest.stream_token`.
pub const STREAM_TOKEN_HEADER: &str = "jobq-stream-token";

/// Most leases one `Heartbeat` call may name. The server refuses a call
/// over it (INVALID_ARGUMENT); clients send one call per this many leases.
/// It is independent of a stream's capacity and of `--max-capacity`: a
/// worker may hold leases of several streams (after a reconnect), and a
/// server with a small `--max-capacity` must still take its heartbeats.
pub const MAX_HEARTBEAT_LEASES: usize = 1000;

/// The longest progress message the server takes by default
/// (`--max-progress-message-bytes`): clients cut a longer one to this
/// many bytes, at a character boundary, before they send it.
pub const PROGRESS_MESSAGE_BYTES: usize = 256;

/// The largest reply jobq's clients decode: 64 MiB, above the server's
/// largest message by default (`--max-message-bytes`, 16 MiB), so a job
/// with a big payload and a long history can always be read back. gRPC's
/// usual client default (4 MiB) is below a single maximal job.
pub const MAX_DECODE_BYTES: usize = 64 * 1024 * 1024;

/// The canonical upper-case name of a gRPC code (`NOT_FOUND`), as grpcurl
/// and the other gRPC tools print it: the CLI's messages and the server's
/// `code` metric label both use it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
