//! What a client without a token can do to a server it can reach: health
//! and reflection are open to it, so what it can hold there is bounded.
//! - Health calls whose bodies stall draw on a small budget of their own
//!   (at most 4 KiB each), never on the one of authorised calls.
//! - One HTTP/2 connection opens at most `--max-streams-per-connection`
//!   calls at once.
//! - Health Watch streams are capped (`--max-health-watches`) and do not
//!   keep their connection from the idle timeout.
//! - One address holds at most `--max-connections-per-peer` connections.
//! - A connection that sent a byte but no HTTP/2 preface is closed after
//!   the handshake timeout.
//!
//! A real server on 127.0.0.1:0 with tokens on; a raw HTTP/2 client (h2)
//! where tonic would hide the frames.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{req, TestServer};
use jobq::pb;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tonic::Code;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

/// An HTTP/2 connection of its own to `server`.
async fn h2_connection(server: &TestServer) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// Starts a Health/Check whose body declares a 4 MiB message, sends
/// `sent` bytes of it, and stalls. Returns its response future (kept so
/// the stream stays open) and its body sender.
async fn stalled_health_check(
    send: &mut h2::client::SendRequest<Bytes>,
    sent: usize,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let request = http::Request::builder()
        .method("POST")
        .uri("http://localhost/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let mut ready = send.clone().ready().await.unwrap();
    let (response, mut body) = ready.send_request(request, false).unwrap();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(4u32 << 20).to_be_bytes());
    frame.resize(5 + sent, b'x');
    body.reserve_capacity(frame.len());
    body.send_data(Bytes::from(frame), false).unwrap();
    (response, body)
}

/// The gRPC status of a response that ended (in its headers or trailers).
async fn grpc_status(response: h2::client::ResponseFuture) -> Option<i32> {
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .ok()?
        .ok()?;
    if let Some(s) = response.headers().get("grpc-status") {
        return s.to_str().ok()?.parse().ok();
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let _ = chunk;
    }
    let trailers = body.trailers().await.ok()??;
    trailers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

#[tokio::test]
async fn stalled_health_bodies_leave_the_budget_to_authorised_calls() {
    let server = TestServer::with(|c| c.max_inflight_request_bytes = 64 * 1024).await;
    let mut strangers = h2_connection(&server).await;
    let (first, _b1) = stalled_health_check(&mut strangers, 40 * 1024).await;
    let (second, _b2) = stalled_health_check(&mut strangers, 40 * 1024).await;

    let mut c = server.client().await;
    let job = pb::EnqueueRequest {
        queue: "in.budget".into(),
        kind: "k".into(),
        payload: vec![7; 16 * 1024],
        ..Default::default()
    };
    c.enqueue(req(job, Some("producer")))
        .await
        .expect("an authorised call gets its bytes");
    // Each stalled call went over its own small budget, and was refused.
    let exhausted = Code::ResourceExhausted as i32;
    assert_eq!(grpc_status(first).await, Some(exhausted));
    assert_eq!(grpc_status(second).await, Some(exhausted));
}

#[tokio::test]
async fn one_connection_opens_at_most_its_stream_limit() {
    let server = TestServer::with(|c| c.max_streams_per_connection = 16).await;
    let mut send = h2_connection(&server).await;
    // The server's SETTINGS arrive with its first frames.
    let (_response, _body) = stalled_health_check(&mut send, 1).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while send.current_max_send_streams() != 16 {
        assert!(
            Instant::now() < deadline,
            "the server allows {} streams per connection",
            send.current_max_send_streams()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn health_watches_are_capped_and_do_not_keep_a_connection() {
    let server = TestServer::with(|c| {
        c.max_health_watches = 2;
        c.idle_timeout = Duration::from_secs(1);
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let watch = || HealthCheckRequest {
        service: String::new(),
    };
    let mut one = health.watch(watch()).await.expect("first").into_inner();
    let mut two = health.watch(watch()).await.expect("second").into_inner();
    let third = match health.watch(watch()).await {
        Ok(r) => r.into_inner().message().await.map(|_| ()),
        Err(s) => Err(s),
    };
    assert_eq!(
        third.expect_err("a third watch is refused").code(),
        Code::ResourceExhausted
    );
    // Only watches on it: the connection is idle, and is closed.
    for stream in [&mut one, &mut two] {
        let ended = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                match stream.message().await {
                    Ok(Some(_)) => continue,
                    _ => return,
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "a watch kept its connection open");
    }
}

#[tokio::test]
async fn one_address_holds_at_most_its_share_of_connections() {
    let server = TestServer::with(|c| {
        c.max_connections = Some(8);
        c.max_connections_per_peer = Some(3);
        c.handshake_timeout = Duration::from_secs(60);
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(server.addr).await.unwrap());
    }
    let mut fourth = TcpStream::connect(server.addr).await.unwrap();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(10), fourth.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "a fourth connection from one address was kept: {closed:?}"
    );
    drop(held);
}

#[tokio::test]
async fn a_connection_that_sent_one_byte_is_closed_after_the_handshake_timeout() {
    let server = TestServer::with(|c| c.handshake_timeout = Duration::from_secs(1)).await;
    let mut conn = TcpStream::connect(server.addr).await.unwrap();
    conn.write_all(b"P").await.unwrap();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "one byte kept the connection past the handshake timeout"
    );
}
