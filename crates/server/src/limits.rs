//! Limits that hold under abuse, beside the per-request ones in
//! [`crate::validate`]:
//!
//! - [`StreamQuota`]: most Lease streams one token may hold open
//!   (`--max-streams-per-token`), so one tenant cannot take every
//!   `--max-waiters` slot.
//! - [`RequestBudget`]: a tower layer that bounds the request bytes held
//!   in memory by all calls at once (`--max-inflight-request-bytes`). Each
//!   body frame takes its size from a semaphore as it arrives and holds it
//!   until the call answers; a frame that does not fit fails the call with
//!   RESOURCE_EXHAUSTED instead of growing memory. Calls that need no token
//!   (health, reflection) draw on a small budget of their own
//!   (`--max-unauthenticated-request-bytes`, at most
//!   [`UNAUTHENTICATED_CALL_BYTES`] each), so strangers who stall their
//!   bodies cannot take the budget of authorised calls.
//! - [`HealthWatches`]: a tower layer that caps the health Watch streams
//!   open at once (`--max-health-watches`): they need no token and may
//!   stay open for good.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{
    body::Body,
    codegen::{http, Bytes},
    Status,
};
use tower::{Layer, Service};

use crate::{
    auth::Who,
    error::{Error, Result},
};

/// Counts open Lease streams per token.
#[derive(Debug)]
pub struct StreamQuota {
    max: usize,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

/// One stream's place in its token's quota; freed on drop.
#[derive(Debug)]
pub struct QuotaSlot {
    token: Option<String>,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

impl StreamQuota {
    /// At most `max` streams per token.
    pub fn new(max: usize) -> StreamQuota {
        StreamQuota {
            max,
            open: Arc::default(),
        }
    }

    /// A slot for one more stream of `who` (no limit when tokens are off:
    /// `--max-waiters` bounds them all).
    ///
    /// # Errors
    /// [`Error::ResourceExhausted`] when the token already holds `max`.
    pub fn acquire(&self, who: &Who) -> Result<QuotaSlot> {
        let Some(token) = who.owner() else {
            return Ok(QuotaSlot {
                token: None,
                open: Arc::clone(&self.open),
            });
        };
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(token.clone()).or_default();
        if *n >= self.max {
            return Err(Error::ResourceExhausted(format!(
                "token {token:?} already holds {} Lease streams (--max-streams-per-token)",
                self.max
            )));
        }
        *n += 1;
        Ok(QuotaSlot {
            token: Some(token),
            open: Arc::clone(&self.open),
        })
    }
}

impl Drop for QuotaSlot {
    fn drop(&mut self) {
        let Some(token) = &self.token else { return };
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(token) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(token);
            }
        }
    }
}

/// The in-flight request bytes layer; see the module docs.
#[derive(Debug, Clone)]
pub struct RequestBudget {
    bytes: Arc<Semaphore>,
    total: usize,
    /// The budget of calls that need no token.
    unauthenticated: Arc<Semaphore>,
    unauthenticated_total: usize,
}

/// Most request bytes one call that needs no token may hold.
pub const UNAUTHENTICATED_CALL_BYTES: usize = 4096;

/// Whether a call to `path` is served without a token (health and
/// reflection reveal no jobs).
pub fn needs_no_token(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/") || path.starts_with("/grpc.reflection.")
}

impl RequestBudget {
    /// A budget of `total` bytes shared by every call that may carry a
    /// token, and one of `unauthenticated` bytes for the calls that need
    /// none.
    pub fn new(total: usize, unauthenticated: usize) -> RequestBudget {
        let total = total.min(Semaphore::MAX_PERMITS);
        let unauthenticated = unauthenticated.min(Semaphore::MAX_PERMITS);
        RequestBudget {
            bytes: Arc::new(Semaphore::new(total)),
            total,
            unauthenticated: Arc::new(Semaphore::new(unauthenticated)),
            unauthenticated_total: unauthenticated,
        }
    }

    /// Bytes not held by any call now (for tests and metrics).
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

impl<S> Layer<S> for RequestBudget {
    type Service = Budgeted<S>;

    fn layer(&self, inner: S) -> Budgeted<S> {
        Budgeted {
            inner,
            budget: self.clone(),
        }
    }
}

/// The service the layer wraps.
#[derive(Debug, Clone)]
pub struct Budgeted<S> {
    inner: S,
    budget: RequestBudget,
}

/// The permits a call's request frames hold. Once the call has answered,
/// `answered` is set and the permits are released: later frames of a
/// streaming request (server reflection's is the only one) are checked
/// against the budget but not kept, so a long-lived stream cannot pin it.
#[derive(Default)]
struct HeldState {
    permits: Vec<OwnedSemaphorePermit>,
    /// The bytes `permits` hold.
    bytes: usize,
    answered: bool,
}

type Held = Arc<Mutex<HeldState>>;

impl<S, RB> Service<http::Request<Body>> for Budgeted<S>
where
    S: Service<http::Request<Body>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let held: Held = Arc::default();
        let (parts, body) = req.into_parts();
        let body = Body::new(Counted {
            inner: body,
            budget: self.budget.clone(),
            held: Arc::clone(&held),
            unauthenticated: needs_no_token(parts.uri.path()),
        });
        let call = self.inner.call(http::Request::from_parts(parts, body));
        Box::pin(async move {
            let response = call.await;
            // The request's bytes are released once the call has answered
            // (for a Lease stream: once it opened). The body may live on
            // (a streaming request), so its permits are taken out of it.
            let released = {
                let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
                held.answered = true;
                held.bytes = 0;
                std::mem::take(&mut held.permits)
            };
            drop(released);
            response
        })
    }
}

/// A request body that takes each frame's size from the budget.
struct Counted {
    inner: Body,
    budget: RequestBudget,
    held: Held,
    /// A call that needs no token: it draws on the budget of those.
    unauthenticated: bool,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let Poll::Ready(Some(Ok(frame))) = polled else {
            return polled;
        };
        let Some(data) = frame.data_ref() else {
            return Poll::Ready(Some(Ok(frame)));
        };
        let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
        if n == 0 {
            return Poll::Ready(Some(Ok(frame)));
        }
        let (bytes, total, flag) = if self.unauthenticated {
            let held = self.held.lock().unwrap_or_else(|p| p.into_inner()).bytes;
            if held + n as usize > UNAUTHENTICATED_CALL_BYTES {
                return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                    "a call that needs no token may send at most {UNAUTHENTICATED_CALL_BYTES} bytes"
                )))));
            }
            (
                &self.budget.unauthenticated,
                self.budget.unauthenticated_total,
                "--max-unauthenticated-request-bytes",
            )
        } else {
            (
                &self.budget.bytes,
                self.budget.total,
                "--max-inflight-request-bytes",
            )
        };
        match Arc::clone(bytes).try_acquire_many_owned(n) {
            Ok(permit) => {
                let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                if held.answered {
                    // Checked, not kept: see `HeldState`.
                    drop(permit);
                } else {
                    held.permits.push(permit);
                    held.bytes += n as usize;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Err(_) => Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                "the server holds its limit of {total} bytes of requests in flight ({flag}); retry later"
            ))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Caps the health Watch streams open at once; see the module docs.
#[derive(Debug, Clone)]
pub struct HealthWatches {
    open: Arc<Semaphore>,
    max: usize,
}

impl HealthWatches {
    /// At most `max` Watch streams at once.
    pub fn new(max: usize) -> HealthWatches {
        let max = max.min(Semaphore::MAX_PERMITS);
        HealthWatches {
            open: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

impl<S> Layer<S> for HealthWatches {
    type Service = Watched<S>;

    fn layer(&self, inner: S) -> Watched<S> {
        Watched {
            inner,
            watches: self.clone(),
        }
    }
}

/// The service [`HealthWatches`] wraps.
#[derive(Debug, Clone)]
pub struct Watched<S> {
    inner: S,
    watches: HealthWatches,
}

impl<S, B> Service<http::Request<B>> for Watched<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != crate::connections::HEALTH_WATCH {
            let call = self.inner.call(req);
            return Box::pin(call);
        }
        let Ok(permit) = Arc::clone(&self.watches.open).try_acquire_owned() else {
            let refused = Status::resource_exhausted(format!(
                "the server has its limit of {} health Watch streams open (--max-health-watches)",
                self.watches.max
            ));
            return Box::pin(std::future::ready(Ok(refused.into_http())));
        };
        let call = self.inner.call(req);
        Box::pin(async move {
            let response = call.await?;
            Ok(response.map(|body| {
                Body::new(Holding {
                    inner: body,
                    _permit: permit,
                })
            }))
        })
    }
}

/// A response body that keeps its Watch's place until it is dropped.
struct Holding {
    inner: Body,
    _permit: OwnedSemaphorePermit,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, Status>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{digest_hex, Auth, Tokens};

    #[test]
    fn a_token_holds_at_most_max_streams_and_a_closed_one_frees_its_slot() {
        let tokens = Tokens::parse(&format!(
            "[[token]]\nname='w'\nsha256='{}'\nqueues=['*']\nroles=['consume']\n",
            digest_hex("s")
        ))
        .unwrap();
        let caller = Auth::from_tokens(tokens)
            .authenticate_secret(Some("s"))
            .unwrap()
            .unwrap();
        let who = Who::Token(caller);
        let quota = StreamQuota::new(2);
        let a = quota.acquire(&who).unwrap();
        let _b = quota.acquire(&who).unwrap();
        assert!(matches!(
            quota.acquire(&who),
            Err(Error::ResourceExhausted(_))
        ));
        drop(a);
        let _c = quota.acquire(&who).unwrap();
        // Without tokens there is no per-token quota.
        let anyone: Vec<_> = (0..5)
            .map(|_| quota.acquire(&Who::Anyone).unwrap())
            .collect();
        assert_eq!(anyone.len(), 5);
    }
}
