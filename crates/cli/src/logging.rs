//! Logs to stderr through `tracing`: readable text, or one JSON object per
//! line (`--log-format json`) whose fields (`job.id`, `queue`, `attempt`, …)
//! stay fields, for log pipelines that index them. With `--otlp-endpoint`,
//! spans are also exported over OTLP/gRPC; without it no OpenTelemetry
//! layer exists, so tracing costs nothing extra.

use anyhow::Context;
use clap::ValueEnum;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    runtime::Tokio,
    trace::{span_processor_with_async_runtime::BatchSpanProcessor, SdkTracerProvider},
    Resource,
};
use tracing_subscriber::{layer::SubscriberExt, util::SubscriberInitExt, EnvFilter, Layer};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, with the event's fields and its spans.
    Json,
}

/// The OTLP exporter, flushed by [`Telemetry::shutdown`].
pub struct Telemetry(Option<SdkTracerProvider>);

impl Telemetry {
    /// Exports the spans still buffered and stops the exporter.
    pub async fn shutdown(self) {
        if let Some(provider) = self.0 {
            // The processor's shutdown blocks until its task has flushed.
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }
}

/// Installs the global subscriber. `RUST_LOG` wins over `default_level`.
/// Must run inside the Tokio runtime (the exporter's batches run on it).
///
/// # Errors
/// When the OTLP endpoint is not a valid URL.
pub fn init(
    format: LogFormat,
    default_level: &str,
    otlp_endpoint: Option<&str>,
    service: &'static str,
) -> anyhow::Result<Telemetry> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
    };
    let provider = otlp_endpoint
        .map(|endpoint| otlp(endpoint, service))
        .transpose()?;
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("jobq"))
            .boxed()
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .init();
    Ok(Telemetry(provider))
}

/// A tracer provider that batches spans to an OTLP/gRPC collector.
fn otlp(endpoint: &str, service: &'static str) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .with_context(|| format!("--otlp-endpoint {endpoint:?}"))?;
    Ok(SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter, Tokio).build())
        .with_resource(Resource::builder().with_service_name(service).build())
        .build())
}
