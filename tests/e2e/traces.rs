//! One trace per job: with an in-memory OpenTelemetry exporter, the
//! producer's span, the server's Enqueue span and the worker's handler span
//! share one trace id, and the handler span of a redelivery is again a
//! child of the producer's span.

use std::{
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc,
    },
    time::Duration,
};

use jobq::pb;
use jobq_client::{EnqueueOptions, HandlerError, JobContext, Worker};
use opentelemetry::trace::{SpanId, TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use crate::harness::{until, TestServer};

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test]
async fn producer_server_and_worker_share_one_trace_across_a_redelivery() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    // This test's thread only; the in-process server and worker run on it.
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = TestServer::start().await;
    let c = server.client().await;
    let producer = tracing::info_span!("checkout");
    let trace_id = producer.context().span().span_context().trace_id();
    let producer_id = producer.context().span().span_context().span_id();
    let (job, _) = c
        .enqueue(
            "mail",
            "send-email",
            "{}",
            EnqueueOptions::new().metadata("request-id", "req-42"),
        )
        .instrument(producer.clone())
        .await
        .expect("enqueue");
    drop(producer);
    assert_eq!(
        job.metadata.get("request-id").map(String::as_str),
        Some("req-42")
    );
    let traceparent = job.metadata.get("traceparent").expect("traceparent stored");
    assert!(traceparent.contains(&trace_id.to_string()), "{traceparent}");

    // The first run fails and asks to be retried at once; the second acks.
    let runs = Arc::new(AtomicU32::new(0));
    let shutdown = CancellationToken::new();
    let counted = Arc::clone(&runs);
    let worker = Worker::builder(server.url())
        .queues(["mail"])
        .lease(Duration::from_secs(30))
        .shutdown(shutdown.clone())
        .handler("send-email", move |_ctx: JobContext| {
            let counted = Arc::clone(&counted);
            async move {
                if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(HandlerError::retry_after("smtp timeout", Duration::ZERO));
                }
                Ok(())
            }
        })
        .build();
    let run = tokio::spawn(worker.run());
    until(
        Duration::from_secs(20),
        "the job DONE on its second run",
        || {
            let (c, id) = (c.clone(), job.id.clone());
            async move {
                let j = c.get_job(id).await.ok()?;
                (j.status == pb::JobStatus::Done as i32).then_some(())
            }
        },
    )
    .await;
    shutdown.cancel();
    run.await.expect("join").expect("worker");
    server.stop().await;
    provider.force_flush().expect("flush");

    let spans = exporter.get_finished_spans().expect("spans");
    let checkout = named(&spans, "checkout");
    assert_eq!(checkout.len(), 1);
    assert_eq!(checkout[0].span_context.trace_id(), trace_id);

    let enqueue = named(&spans, "jobq.v1.JobQueue/Enqueue");
    assert_eq!(enqueue.len(), 1, "the server's Enqueue span");
    assert_eq!(enqueue[0].span_context.trace_id(), trace_id);
    assert_eq!(enqueue[0].parent_span_id, producer_id);

    let handlers = named(&spans, "job");
    assert_eq!(handlers.len(), 2, "one handler span per delivery");
    for h in &handlers {
        assert_eq!(h.span_context.trace_id(), trace_id);
        assert_eq!(h.parent_span_id, producer_id, "a child of the producer");
        assert_ne!(h.parent_span_id, SpanId::INVALID);
    }
    let mut attempts: Vec<_> = handlers
        .iter()
        .filter_map(|h| {
            h.attributes
                .iter()
                .find(|kv| kv.key.as_str() == "job.attempt")
                .map(|kv| kv.value.to_string())
        })
        .collect();
    attempts.sort();
    assert_eq!(
        attempts,
        ["1", "2"],
        "the attempt number (1-based) is on the span"
    );
    // The worker's Ack joins the trace too, as a child of the handler.
    let acks = named(&spans, "jobq.v1.JobQueue/Ack");
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].span_context.trace_id(), trace_id);
}
