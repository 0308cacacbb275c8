//! The jobq wire contract.
//!
//! Layout:
//! - [`pb`]: the Rust code generated from `proto/jobq/v1/jobq.proto`
//!   (messages, the `JobQueue` client and server traits). Nothing
//!   hand-written lives next to it; domain types and conversions are in
//!   `jobq-server`.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptor set, for gRPC server
//!   reflection and for tools that need the schema at run time.
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
