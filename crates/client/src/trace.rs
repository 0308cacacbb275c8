//! W3C trace context between producer, server and worker.
//!
//! A producer's enqueue carries the `traceparent`/`tracestate` of the
//! caller's current span in the job's metadata (and every call carries them
//! as gRPC headers, so the server's spans join in). The Worker runs each
//! handler in a span whose parent is the producer's span, on every
//! delivery: a redelivery after a crash belongs to the same trace.
//!
//! This only writes anything when the application has installed a
//! `tracing-opentelemetry` layer; otherwise the current span has no trace
//! and nothing is added.

use std::collections::HashMap;

use opentelemetry::{
    propagation::{Extractor, Injector, TextMapPropagator},
    trace::TraceContextExt,
    Context,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The trace context of the current `tracing` span, if it belongs to a
/// trace.
fn current() -> Option<Context> {
    let cx = tracing::Span::current().context();
    cx.span().span_context().is_valid().then_some(cx)
}

struct MapInjector<'a>(&'a mut HashMap<String, String>);

impl Injector for MapInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // What the producer set by hand wins.
        self.0.entry(key.to_owned()).or_insert(value);
    }
}

struct MapExtractor<'a>(&'a HashMap<String, String>);

impl Extractor for MapExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            value.parse(),
        ) {
            self.0.insert(key, value);
        }
    }
}

/// Adds the current span's `traceparent` (and `tracestate`) to a job's
/// metadata, unless the caller already set them.
pub(crate) fn inject_metadata(metadata: &mut HashMap<String, String>) {
    if let Some(cx) = current() {
        TraceContextPropagator::new().inject_context(&cx, &mut MapInjector(metadata));
    }
}

/// A request carrying the current span's trace context as gRPC headers.
pub(crate) fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(cx) = current() {
        TraceContextPropagator::new()
            .inject_context(&cx, &mut HeaderInjector(request.metadata_mut()));
    }
    request
}

/// The producer's trace context from a job's metadata (empty when it has
/// none).
pub fn extract(metadata: &HashMap<String, String>) -> Context {
    TraceContextPropagator::new().extract(&MapExtractor(metadata))
}

/// The trace id of the producer's `traceparent` in `metadata`, as logs
/// show it (32 hex digits).
pub fn trace_id(metadata: &HashMap<String, String>) -> Option<String> {
    let cx = extract(metadata);
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// Makes `span` a child of the producer's span named in `metadata`.
pub(crate) fn continue_trace(span: &tracing::Span, metadata: &HashMap<String, String>) {
    let cx = extract(metadata);
    if cx.span().span_context().is_valid() {
        // Fails only when no OpenTelemetry layer is installed: then there
        // is no trace to continue.
        let _ = span.set_parent(cx);
    }
}
