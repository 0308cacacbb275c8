//! A tower layer that times every `jobq.v1.JobQueue` call into
//! `jobq_rpc_duration_seconds{method,code}`: from the request to the
//! response headers (for a Lease stream, to its opening). The code is the
//! `grpc-status` of a trailers-only response (how tonic answers an error),
//! and OK otherwise.
//!
//! A call whose caller sent W3C trace context (`traceparent`) runs in a
//! `rpc` span that continues the caller's trace, so the server's part of a
//! job's story (its Enqueue, a worker's Ack) shows in the producer's trace.
//! Untraced calls get no span: tracing costs nothing unless a caller asks.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use opentelemetry::{
    propagation::{Extractor, TextMapPropagator},
    trace::TraceContextExt,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::codegen::http;
use tower::{Layer, Service};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::metrics::Metrics;

const PREFIX: &str = "/jobq.v1.JobQueue/";

/// The layer; see the module docs.
#[derive(Clone)]
pub struct RpcTiming {
    metrics: Arc<Metrics>,
}

impl RpcTiming {
    /// Times into `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> RpcTiming {
        RpcTiming { metrics }
    }
}

impl<S> Layer<S> for RpcTiming {
    type Service = Timed<S>;

    fn layer(&self, inner: S) -> Timed<S> {
        Timed {
            inner,
            metrics: Arc::clone(&self.metrics),
        }
    }
}

/// The service the layer wraps.
#[derive(Clone)]
pub struct Timed<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, RB> Service<http::Request<B>> for Timed<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req
            .uri()
            .path()
            .strip_prefix(PREFIX)
            .map(|m| m.chars().take(32).collect::<String>());
        let started = Instant::now();
        let span = traced_span(&req, method.as_deref());
        let call = self.inner.call(req);
        let metrics = Arc::clone(&self.metrics);
        let call = async move {
            let response = call.await;
            if let (Some(method), Ok(response)) = (method, &response) {
                let code = response
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map_or(tonic::Code::Ok, tonic::Code::from_i32);
                metrics.rpc(&method, code, started.elapsed());
            }
            response
        };
        match span {
            Some(span) => Box::pin(call.instrument(span)),
            None => Box::pin(call),
        }
    }
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A span for a call that carries a valid `traceparent`, as its child.
fn traced_span<B>(req: &http::Request<B>, method: Option<&str>) -> Option<tracing::Span> {
    req.headers().get("traceparent")?;
    let cx = TraceContextPropagator::new().extract(&Headers(req.headers()));
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let method = crate::metrics::known_method(method.unwrap_or_default());
    let trace_id = cx.span().span_context().trace_id().to_string();
    let span = tracing::info_span!(
        "rpc",
        otel.name = format!("jobq.v1.JobQueue/{method}"),
        otel.kind = "server",
        rpc.method = method,
        trace_id = %trace_id,
    );
    // Fails only when no OpenTelemetry layer is installed.
    let _ = span.set_parent(cx);
    Some(span)
}
