//! Security end to end: TLS and mTLS with a throwaway rcgen CA, SIGHUP
//! reloading the tokens file of a real `jobq serve` process, and `serve`
//! refusing to expose itself by accident.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use jobq::pb;
use jobq_client::{Client, EnqueueOptions};
use tonic::Code;

use crate::{
    harness::{dead_letter, http, signal, until, ServerProcess, TestServer, JOBQ},
    pki::{tokens_file, Pki},
};

fn https(server: &TestServer) -> String {
    format!("https://localhost:{}", server.addr.port())
}

/// The first RPC's result: with TLS, a bad handshake may only show on use.
async fn try_stats(connect: jobq_client::Connect) -> Result<(), String> {
    let client = connect.connect().await.map_err(|e| format!("{e:?}"))?;
    client
        .stats(None)
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn tls_end_to_end_and_the_wrong_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "good");
    let other = Pki::new(dir.path(), "other");
    let server = TestServer::with(|c| {
        c.tls_cert = Some(pki.server_cert.clone());
        c.tls_key = Some(pki.server_key.clone());
    })
    .await;

    let client = Client::builder(https(&server))
        .ca_cert(pki.ca_pem())
        .connect()
        .await
        .expect("connect over TLS");
    let (job, _) = client
        .enqueue(
            "tls",
            "k",
            b"secret payload".to_vec(),
            EnqueueOptions::new(),
        )
        .await
        .expect("enqueue over TLS");
    assert_eq!(
        client.get_job(job.id).await.unwrap().payload,
        b"secret payload"
    );
    // By IP too: the certificate names 127.0.0.1.
    let by_ip = Client::builder(format!("https://{}", server.addr)).ca_cert(pki.ca_pem());
    assert_eq!(try_stats(by_ip).await, Ok(()));

    // A client that trusts another CA refuses the server.
    let wrong = Client::builder(https(&server)).ca_cert(other.ca_pem());
    assert!(
        try_stats(wrong).await.is_err(),
        "a server signed by an untrusted CA was accepted"
    );
    // Plaintext to a TLS port gets nowhere.
    let plain = Client::builder(format!("http://{}", server.addr));
    assert!(
        try_stats(plain).await.is_err(),
        "plaintext reached a TLS server"
    );
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "good");
    let other = Pki::new(dir.path(), "other");
    let server = TestServer::with(|c| {
        c.tls_cert = Some(pki.server_cert.clone());
        c.tls_key = Some(pki.server_key.clone());
        c.tls_client_ca = Some(pki.ca.clone());
    })
    .await;

    let (cert, key) = pki.client_identity();
    let with_cert = Client::builder(https(&server))
        .ca_cert(pki.ca_pem())
        .identity(cert, key);
    assert_eq!(try_stats(with_cert).await, Ok(()));

    let without = Client::builder(https(&server)).ca_cert(pki.ca_pem());
    assert!(
        try_stats(without).await.is_err(),
        "a client without a certificate got in"
    );

    let (cert, key) = other.client_identity();
    let foreign = Client::builder(https(&server))
        .ca_cert(pki.ca_pem())
        .identity(cert, key);
    assert!(
        try_stats(foreign).await.is_err(),
        "a certificate from another CA got in"
    );
}

#[tokio::test]
async fn sighup_reloads_the_tokens_file_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    tokens_file(&tokens, &[("alice", "alice-secret-1", &["admin"], &["*"])]);
    let tokens_arg = tokens.to_str().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"), &["--auth-tokens", tokens_arg]);
    let connect = |secret: &str| Client::builder(server.url()).token(secret).connect();
    let alice = connect("alice-secret-1").await.expect("connect");
    let bob = connect("bob-secret-2").await.expect("connect");
    alice.stats(None).await.expect("alice is known");
    assert_eq!(
        bob.stats(None).await.unwrap_err().code(),
        Some(Code::Unauthenticated)
    );
    // Alice holds a Lease stream across the reload.
    let mut stream = alice
        .lease(["reload"], "w-alice", 1, Some(Duration::from_secs(30)))
        .await
        .expect("lease stream");

    // Bob is added, and alice loses admin (consume on `reload` only).
    tokens_file(
        &tokens,
        &[
            ("alice", "alice-secret-1", &["consume", "read"], &["reload"]),
            ("bob", "bob-secret-2", &["produce", "read"], &["reload"]),
        ],
    );
    signal(&server.child, libc::SIGHUP);
    until(
        Duration::from_secs(30),
        "bob to be accepted after SIGHUP",
        || async { bob.stats(None).await.ok() },
    )
    .await;
    // The old stream still delivers: bob's job reaches alice on it.
    let (job, _) = bob
        .enqueue("reload", "k", b"x".to_vec(), EnqueueOptions::new())
        .await
        .expect("bob enqueues");
    let event = tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("an event within 30 s")
        .expect("the stream is still open")
        .expect("an event");
    let Some(pb::lease_event::Event::Leased(leased)) = event.event else {
        panic!("expected a leased job, got {event:?}");
    };
    assert_eq!(leased.job.as_ref().unwrap().id, job.id);
    alice
        .ack(job.id.clone(), leased.lease_id.clone())
        .await
        .expect("alice acks on the same connection");
    // Alice's new roles apply at once: no more admin.
    assert_eq!(
        alice.retry(job.id.clone()).await.unwrap_err().code(),
        Some(Code::PermissionDenied)
    );

    // A broken file is refused and the tokens stay as they were.
    std::fs::write(&tokens, "[[token]]\nname = 'broken'\n").unwrap();
    signal(&server.child, libc::SIGHUP);
    // Removing bob after the broken file proves the broken one was read
    // (and skipped): the next good reload takes effect.
    tokens_file(&tokens, &[("alice", "alice-secret-1", &["read"], &["*"])]);
    signal(&server.child, libc::SIGHUP);
    until(
        Duration::from_secs(10),
        "bob to be refused after his removal",
        || async {
            (bob.stats(None).await.err()?.code() == Some(Code::Unauthenticated)).then_some(())
        },
    )
    .await;
    alice.stats(None).await.expect("alice is still known");
    // Alice may now only read: her stream, which consumes `reload`, ends.
    let ended = tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("the stream ends within 30 s")
        .expect_err("an error ends it");
    assert_eq!(ended.code(), Code::PermissionDenied, "{ended:?}");
    assert!(ended.message().contains("reload"), "{ended:?}");
}

/// A token removed from the file loses its open Lease stream at the next
/// SIGHUP, not only its next calls: the stream ends UNAUTHENTICATED and
/// the job it held comes back for other workers, as a gone worker's does.
/// Another token's heartbeat for the same worker id touches nothing.
#[tokio::test]
async fn sighup_ends_the_lease_streams_of_a_revoked_token() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    let admin = ("root", "root-secret", &["admin"][..], &["*"][..]);
    let worker = ("leaked", "leaked-secret", &["consume"][..], &["q"][..]);
    tokens_file(&tokens, &[admin, worker]);
    let tokens_arg = tokens.to_str().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"), &["--auth-tokens", tokens_arg]);
    let connect = |secret: &str| Client::builder(server.url()).token(secret).connect();
    let root = connect("root-secret").await.expect("connect");
    let leaked = connect("leaked-secret").await.expect("connect");
    let (job, _) = root
        .enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new())
        .await
        .expect("enqueue");
    let mut stream = leaked
        .lease(["q"], "w", 1, Some(Duration::from_secs(60)))
        .await
        .expect("lease stream");
    let event = tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("an event within 30 s")
        .expect("the stream is open")
        .expect("an event");
    assert!(
        matches!(event.event, Some(pb::lease_event::Event::Leased(_))),
        "{event:?}"
    );

    tokens_file(&tokens, &[admin]);
    signal(&server.child, libc::SIGHUP);
    let ended = tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("the stream ends within 30 s")
        .expect_err("an error ends it");
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert!(ended.message().contains("revoked"), "{ended:?}");
    let back = until(Duration::from_secs(30), "the job to come back", || async {
        let j = root.get_job(job.id.clone()).await.ok()?;
        (j.status == pb::JobStatus::Pending as i32).then_some(j)
    })
    .await;
    assert_eq!(back.attempts, 1, "{back:?}");
    assert_eq!(
        leaked.stats(None).await.unwrap_err().code(),
        Some(Code::Unauthenticated)
    );
}

#[tokio::test]
async fn a_broken_tokens_file_keeps_the_old_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    tokens_file(&tokens, &[("alice", "alice-secret-1", &["read"], &["*"])]);
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &["--auth-tokens", tokens.to_str().unwrap()],
    );
    let alice = Client::builder(server.url())
        .token("alice-secret-1")
        .connect()
        .await
        .unwrap();
    std::fs::write(&tokens, "this is not toml [[[").unwrap();
    signal(&server.child, libc::SIGHUP);
    // Nothing observable changes: poll a while and require alice to stay in.
    for _ in 0..20 {
        alice.stats(None).await.expect("alice keeps working");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[test]
fn serve_refuses_a_public_address_without_tls_and_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let run = |extra: &[&str]| {
        Command::new(JOBQ)
            .args(["serve", "--data"])
            .arg(&data)
            .args(["--http-listen", "off"])
            .args(extra)
            .env_remove("JOBQ_LISTEN")
            .stdin(Stdio::null())
            .output()
            .expect("run jobq serve")
    };
    let out = run(&["--listen", "0.0.0.0:0"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without TLS and without tokens")
            && stderr.contains("--insecure"),
        "{stderr}"
    );
    // Tokens alone are not enough on a public address: they would travel
    // in clear.
    let tokens = dir.path().join("tokens.toml");
    tokens_file(&tokens, &[("a", "s", &["read"], &["*"])]);
    let out = run(&[
        "--listen",
        "0.0.0.0:0",
        "--auth-tokens",
        tokens.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without TLS"));
    // The dashboard too.
    let out = Command::new(JOBQ)
        .args(["serve", "--data"])
        .arg(&data)
        .args(["--listen", "127.0.0.1:0", "--http-listen", "0.0.0.0:0"])
        .stdin(Stdio::null())
        .output()
        .expect("run jobq serve");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without --auth-tokens"));
    // With tokens, still not over plain HTTP to the network.
    let out = Command::new(JOBQ)
        .args(["serve", "--data"])
        .arg(&data)
        .args(["--listen", "127.0.0.1:0", "--http-listen", "0.0.0.0:0"])
        .args(["--auth-tokens", tokens.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .expect("run jobq serve");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("over plain HTTP"));
}

/// A certificate and key rustls cannot use are refused before the store
/// opens, not once it has started its tasks (then sled was left unclosed).
#[test]
fn serve_refuses_a_swapped_certificate_and_key_before_opening_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let pki = Pki::new(dir.path(), "swapped");
    let out = crate::harness::serve_refused(
        &data,
        &[
            "--tls-cert",
            pki.server_key.to_str().unwrap(),
            "--tls-key",
            pki.server_cert.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {stderr}");
    assert!(stderr.contains("TLS"), "{stderr}");
    assert!(!data.exists(), "opened the data folder first: {stderr}");
}

#[test]
fn serve_on_a_public_address_with_insecure_starts() {
    let dir = tempfile::tempdir().unwrap();
    let mut server =
        ServerProcess::start_at(&dir.path().join("data"), "0.0.0.0:0", &["--insecure"]);
    assert!(server.addr.ip().is_unspecified());
    assert!(server.terminate().success());
}

#[tokio::test]
async fn the_dashboard_asks_for_a_token_read_to_view_admin_to_retry() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    tokens_file(
        &tokens,
        &[
            ("ops", "ops-secret", &["admin"], &["*"]),
            ("viewer", "viewer-secret", &["read"], &["mine"]),
            ("shop", "shop-secret", &["produce"], &["*"]),
        ],
    );
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &["--auth-tokens", tokens.to_str().unwrap()],
    );
    let ops = Client::builder(server.url())
        .token("ops-secret")
        .connect()
        .await
        .unwrap();
    for queue in ["mine", "theirs"] {
        ops.enqueue(
            queue,
            "k",
            b"x".to_vec(),
            EnqueueOptions::new().max_attempts(1),
        )
        .await
        .unwrap();
    }
    // A dead letter in `mine` to retry.
    let leased = ops
        .dequeue(["mine"], "w", None, None)
        .await
        .unwrap()
        .expect("a job");
    let id = leased.job.as_ref().unwrap().id.clone();
    ops.fail(
        id.clone(),
        leased.lease_id.clone(),
        "boom",
        jobq_client::FailOptions::fatal(),
    )
    .await
    .unwrap();
    let web = server.http;

    // No token: a login form, and 401 for /metrics.
    let (status, head, body) = http(web, "GET", "/", &[], "").await;
    assert_eq!(status, 401, "{head}");
    assert!(body.contains(r#"action="/login""#), "{body}");
    assert_eq!(http(web, "GET", "/metrics", &[], "").await.0, 401);
    assert_eq!(
        http(web, "GET", "/jobs", &[("Authorization", "Bearer nope")], "")
            .await
            .0,
        401
    );

    // Read: sees its queues only; may not retry.
    let viewer = [("Authorization", "Bearer viewer-secret")];
    let (status, _, body) = http(web, "GET", "/", &viewer, "").await;
    assert_eq!(status, 200);
    assert!(body.contains("mine") && !body.contains("theirs"), "{body}");
    // Rates and streams are summed over every queue: not for this token.
    assert!(!body.contains("enqueue-rate"), "{body}");
    let (_, _, body) = http(
        web,
        "GET",
        "/",
        &[("Authorization", "Bearer ops-secret")],
        "",
    )
    .await;
    assert!(
        body.contains("enqueue-rate"),
        "a token that reads all sees them"
    );
    // Without a queue: its queues to pick from, no jobs (across queues
    // the next-page link would name other queues' jobs).
    let (status, _, body) = http(web, "GET", "/jobs?status=FAILED", &viewer, "").await;
    assert_eq!(status, 200);
    assert!(!body.contains("theirs"), "{body}");
    assert!(!body.contains(r#"id="jobs""#), "{body}");
    assert!(
        body.contains(r#"href="/jobs?queue=mine&amp;status=FAILED""#),
        "{body}"
    );
    let (status, _, body) = http(web, "GET", "/jobs?queue=mine", &viewer, "").await;
    assert_eq!(status, 200);
    assert!(body.contains(r#"id="jobs""#), "{body}");
    // A queue it may not read is refused, as ListJobs refuses it.
    let (status, _, body) = http(web, "GET", "/jobs?queue=theirs&status=FAILED", &viewer, "").await;
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains(r#"action="/retry""#), "{body}");
    // /metrics counts every queue: it takes a token that reads them all.
    assert_eq!(http(web, "GET", "/metrics", &viewer, "").await.0, 403);
    let ops_token = [("Authorization", "Bearer ops-secret")];
    assert_eq!(http(web, "GET", "/metrics", &ops_token, "").await.0, 200);
    let retry = format!("/jobs/{id}/retry");
    assert_eq!(http(web, "POST", &retry, &viewer, "").await.0, 403);
    // No read role at all.
    assert_eq!(
        http(
            web,
            "GET",
            "/",
            &[("Authorization", "Bearer shop-secret")],
            ""
        )
        .await
        .0,
        403
    );

    // Admin retries.
    let (status, _, _) = http(
        web,
        "POST",
        &retry,
        &[("Authorization", "Bearer ops-secret")],
        "",
    )
    .await;
    assert_eq!(status, 303);
    assert_eq!(
        ops.get_job(id.clone()).await.unwrap().status,
        pb::JobStatus::Pending as i32
    );

    // A browser logs in once; the cookie is HttpOnly.
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let (status, _, _) = http(web, "POST", "/login", &form, "token=wrong").await;
    assert_eq!(status, 401);
    let (status, head, _) = http(web, "POST", "/login", &form, "token=viewer-secret").await;
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .expect("a cookie")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();
    let (status, _, body) = http(web, "GET", "/", &[("Cookie", &pair)], "").await;
    assert_eq!(status, 200);
    assert!(body.contains("mine"));
}

/// With tokens off (the loopback default) nothing but the browser's own
/// headers tells a dashboard POST from one another site's page made it
/// send: such a POST is refused and changes nothing.
#[tokio::test]
async fn the_dashboard_refuses_a_cross_site_post() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"), &[]);
    let c = server.client().await;
    c.enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new())
        .await
        .unwrap();
    let id = dead_letter(&c, "q").await.id;
    let web = server.http;
    let form = ("Content-Type", "application/x-www-form-urlencoded");
    let evil_origin = [form, ("Origin", "http://evil.example")];
    let cross_site = [form, ("Sec-Fetch-Site", "cross-site")];
    let same_site = [form, ("Sec-Fetch-Site", "same-site")];
    let null_origin = [form, ("Origin", "null")];
    for headers in [
        &evil_origin[..],
        &cross_site[..],
        &same_site[..],
        &null_origin[..],
    ] {
        let (status, _, _) = http(web, "POST", "/retry", headers, "status=FAILED").await;
        assert_eq!(status, 403, "{headers:?}");
        let (status, _, _) = http(web, "POST", &format!("/jobs/{id}/retry"), headers, "").await;
        assert_eq!(status, 403, "{headers:?}");
    }
    assert_eq!(
        c.get_job(id.clone()).await.unwrap().status,
        pb::JobStatus::Failed as i32,
        "a refused POST changed nothing"
    );
    // The dashboard's own form: same origin, also behind a proxy that
    // rewrote Host (the browser's Sec-Fetch-Site decides). A retry of a
    // kind no job has: allowed, and it changes nothing.
    let proxied = [
        form,
        ("Origin", "https://jobq.example.com"),
        ("Sec-Fetch-Site", "same-origin"),
    ];
    let (status, head, _) = http(web, "POST", "/retry", &proxied, "kind=no-such-kind").await;
    assert_eq!(status, 303, "{head}");
    // A browser without Sec-Fetch-Site: its Origin is the dashboard's.
    let own = format!("http://{web}");
    let same = [form, ("Origin", own.as_str())];
    let (status, head, _) = http(web, "POST", &format!("/jobs/{id}/retry"), &same, "").await;
    assert_eq!(status, 303, "{head}");
    assert_eq!(
        c.get_job(id).await.unwrap().status,
        pb::JobStatus::Pending as i32
    );
}

/// DNS rebinding: a page on `http://evil.example:PORT` re-points its name
/// at 127.0.0.1, and the browser then treats the dashboard as that page's
/// own origin (its POSTs say `Sec-Fetch-Site: same-origin`). Without
/// tokens, only the `Host` header still tells: a name that is not an IP
/// address, `localhost` or an `--http-allow-host` name is refused, for
/// reading and acting alike.
#[tokio::test]
async fn without_tokens_the_dashboard_refuses_an_unknown_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &["--http-allow-host", "jobq.internal"],
    );
    let c = server.client().await;
    c.enqueue("q", "k", b"secret".to_vec(), EnqueueOptions::new())
        .await
        .unwrap();
    let id = dead_letter(&c, "q").await.id;
    let web = server.http;
    let port = web.port();
    let evil = format!("evil.example:{port}");
    let rebound = [("Host", evil.as_str())];
    for path in ["/", "/jobs?status=FAILED", &format!("/jobs/{id}")] {
        let (status, _, body) = http(web, "GET", path, &rebound, "").await;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(!body.contains("secret"), "{body}");
    }
    let form = ("Content-Type", "application/x-www-form-urlencoded");
    let post = [
        form,
        ("Host", evil.as_str()),
        ("Sec-Fetch-Site", "same-origin"),
    ];
    let (status, _, _) = http(web, "POST", "/retry", &post, "status=FAILED").await;
    assert_eq!(status, 403);
    assert_eq!(
        c.get_job(id.clone()).await.unwrap().status,
        pb::JobStatus::Failed as i32,
        "a refused POST changed nothing"
    );
    // `/metrics` (counts, no jobs) answers to any name: Prometheus scrapes
    // by whatever name its targets say.
    assert_eq!(http(web, "GET", "/metrics", &rebound, "").await.0, 200);
    // Addresses, localhost and the allowed name are answered.
    let localhost = format!("localhost:{port}");
    let allowed = format!("jobq.internal:{port}");
    for host in [web.to_string(), localhost, allowed] {
        let (status, _, body) =
            http(web, "GET", &format!("/jobs/{id}"), &[("Host", &host)], "").await;
        assert_eq!(status, 200, "{host}: {body}");
    }
}

#[tokio::test]
async fn metrics_token_free_opens_metrics_only() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    tokens_file(&tokens, &[("ops", "ops-secret", &["admin"], &["*"])]);
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &[
            "--auth-tokens",
            tokens.to_str().unwrap(),
            "--metrics-token-free",
        ],
    );
    let (status, _, body) = http(server.http, "GET", "/metrics", &[], "").await;
    assert_eq!(status, 200);
    assert!(body.contains("jobq_"), "{body}");
    assert_eq!(http(server.http, "GET", "/", &[], "").await.0, 401);
}

async fn next_event(stream: &mut tonic::Streaming<pb::LeaseEvent>) -> pb::lease_event::Event {
    tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("an event within 30 s")
        .expect("the stream is open")
        .expect("an event")
        .event
        .expect("an event")
}

/// A stream whose delivered lease expired without a heartbeat (a frozen
/// worker) gets nothing more until its worker heartbeats. Only a heartbeat
/// with the stream's own token counts: another token that names the same
/// worker id cannot wake it and have jobs pushed to a hung worker.
#[tokio::test]
async fn another_tokens_heartbeat_does_not_wake_a_stalled_stream() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    tokens_file(
        &tokens,
        &[
            ("root", "root-secret", &["admin"], &["*"]),
            ("a", "a-secret", &["consume"], &["q"]),
            ("b", "b-secret", &["consume"], &["other"]),
        ],
    );
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &[
            "--auth-tokens",
            tokens.to_str().unwrap(),
            "--min-lease",
            "10ms",
        ],
    );
    let connect = |secret: &str| Client::builder(server.url()).token(secret).connect();
    let (root, a, b) = (
        connect("root-secret").await.expect("connect"),
        connect("a-secret").await.expect("connect"),
        connect("b-secret").await.expect("connect"),
    );
    let enqueue = || async {
        root.enqueue("q", "k", b"x".to_vec(), EnqueueOptions::new())
            .await
            .expect("enqueue")
            .0
    };
    let first = enqueue().await;
    let mut stream = a
        .lease(["q"], "w", 1, Some(Duration::from_millis(200)))
        .await
        .expect("lease stream");
    assert!(matches!(
        next_event(&mut stream).await,
        pb::lease_event::Event::Leased(_)
    ));
    // No heartbeat: the lease expires, and the stream stalls.
    match next_event(&mut stream).await {
        pb::lease_event::Event::Revoked(r) => assert_eq!(r.job_id, first.id),
        other => panic!("expected revoked, got {other:?}"),
    }
    let second = enqueue().await;
    b.heartbeat("w", vec![], None)
        .await
        .expect("b's heartbeat is accepted, and changes nothing");
    // The first job is due again too; either would show the stream woke.
    let woke = tokio::time::timeout(Duration::from_millis(1500), stream.message()).await;
    assert!(woke.is_err(), "b's heartbeat woke a's stream: {woke:?}");
    // a's own heartbeat does wake it, also once its token was renamed
    // (streams are matched by secret, not name).
    tokens_file(
        &tokens,
        &[
            ("root", "root-secret", &["admin"], &["*"]),
            ("a-renamed", "a-secret", &["consume"], &["q"]),
            ("b", "b-secret", &["consume"], &["other"]),
        ],
    );
    signal(&server.child, libc::SIGHUP);
    until(
        Duration::from_secs(30),
        "the renamed token to load",
        || async { server.logged("SIGHUP: tokens file reloaded").then_some(()) },
    )
    .await;
    a.heartbeat("w", vec![], None).await.expect("a's heartbeat");
    match next_event(&mut stream).await {
        pb::lease_event::Event::Leased(l) => {
            let id = l.job.expect("job").id;
            assert!(id == first.id || id == second.id, "{id}");
        }
        other => panic!("expected a leased job, got {other:?}"),
    }
}
