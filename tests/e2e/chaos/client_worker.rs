//! The fault suite's worker on the Rust client's runtime: a
//! `jobq_client::Worker` on one server, whose history is written from its
//! handler (`leased`, when a run starts) and from the Worker's own log
//! events (`stream` when a Lease stream opens, `acked`, `ack_refused`,
//! `lost`, `revoked`), read by a tracing layer. The Worker does not tell
//! which leases a heartbeat confirmed, so this history has no `confirm`
//! lines: the checks built on heartbeat answers rest on the other workers.
//! An `acked` line carries the time the handler returned (the ack was sent
//! after it).

#[allow(unused_imports)]
use super::*;

use jobq_client::{HandlerError, JobContext, Worker};
use tracing::{
    field::{Field, Visit},
    span, Event, Subscriber,
};
use tracing_subscriber::{layer::Context, prelude::*, registry::LookupSpan, Layer};

struct State {
    history: History,
    slot: usize,
    /// Job id → its current run's lease, and when its handler returned
    /// (0 while it runs).
    runs: Mutex<HashMap<String, (String, u64)>>,
}

/// The `job.id` of a Worker's `job` span.
struct JobSpan(String);

#[derive(Default)]
struct Fields {
    message: String,
    job: Option<String>,
    lease: Option<String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => value.clone_into(&mut self.message),
            "job.id" => self.job = Some(value.to_owned()),
            "lease.id" => self.lease = Some(value.to_owned()),
            _ => {}
        }
    }
}

struct Recorder(Arc<State>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != "job" {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (Some(job), Some(span)) = (fields.job, ctx.span(id)) {
            span.extensions_mut().insert(JobSpan(job));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let m = f.message.as_str();
        let what = if m.starts_with("acked") {
            "acked"
        } else if m.starts_with("lease lost; cancelling") {
            "lost"
        } else if m.starts_with("lease revoked") {
            "revoked"
        } else if m.starts_with("lease no longer held") {
            "ack_refused"
        } else if m == "lease stream open" {
            self.0
                .history
                .rec("stream", "", "", &self.0.slot.to_string());
            return;
        } else {
            return;
        };
        let job = f.job.or_else(|| {
            ctx.event_scope(event)?
                .from_root()
                .find_map(|s| s.extensions().get::<JobSpan>().map(|j| j.0.clone()))
        });
        let Some(job) = job else { return };
        let run = self.0.runs.lock().unwrap().get(&job).cloned();
        let (lease, returned) = match (f.lease, run) {
            (Some(lease), _) => (lease, 0),
            (None, Some(run)) => run,
            (None, None) => return,
        };
        let extra = if what == "acked" {
            returned.to_string()
        } else {
            String::new()
        };
        self.0.history.rec(what, &job, &lease, &extra);
    }
}

/// Runs a `jobq_client::Worker` on `url` (the server of `slot`) until
/// killed.
pub(super) async fn run_client_worker(id: String, url: String, slot: usize, history: History) {
    let state = Arc::new(State {
        history,
        slot,
        runs: Mutex::default(),
    });
    tracing_subscriber::registry()
        .with(Recorder(Arc::clone(&state)))
        .init();
    let handler = move |ctx: JobContext| {
        let state = Arc::clone(&state);
        async move {
            let (job, lease) = (ctx.id().to_owned(), ctx.lease_id().to_owned());
            state
                .history
                .rec("leased", &job, &lease, &state.slot.to_string());
            state
                .runs
                .lock()
                .unwrap()
                .insert(job.clone(), (lease.clone(), 0));
            let work = Duration::from_millis(rand::rng().random_range(10..250));
            tokio::select! {
                () = ctx.cancelled() => return Err(HandlerError::retry("lease lost")),
                () = tokio::time::sleep(work) => {}
            }
            state.runs.lock().unwrap().insert(job, (lease, now_ns()));
            Ok::<(), HandlerError>(())
        }
    };
    Worker::builder(url)
        .queues([QUEUE])
        .worker_id(id)
        .capacity(WORKER_CAPACITY)
        .lease(LEASE)
        .heartbeat_every(HEARTBEAT_EVERY)
        .handle_signals(false)
        .handler("chaos", handler)
        .build()
        .run()
        .await
        .expect("the Worker runs until killed");
}
