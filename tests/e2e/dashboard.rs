//! The dashboard in a real headless browser (Debian's chromium, driven
//! through chromedriver by fantoccini): the counts shown equal Stats, a
//! reclaimed job's page shows every attempt, Retry on a dead letter makes
//! it PENDING as `jobq get` confirms, and a screenshot is saved.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use fantoccini::{Client as Browser, ClientBuilder, Locator};
use jobq::pb;
use jobq_client::{EnqueueOptions, FailOptions};

use crate::harness::{free_port, until, ServerProcess, JOBQ};

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// chromedriver on a free port, and a headless chromium session.
async fn browser(profile: &std::path::Path) -> (Driver, Browser) {
    // tonic's TLS brings rustls' ring provider and fantoccini's its
    // aws-lc-rs one: with both compiled in, rustls wants one chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let port = free_port();
    let driver = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "chromedriver is needed for this test and could not be run ({e}); \
                 install it with `apt-get install chromium chromium-driver` (.ci/run does)"
            )
        });
    let driver = Driver(driver);
    let url = format!("http://127.0.0.1:{port}");
    let mut caps = serde_json::Map::new();
    let mut chrome = serde_json::json!({
        "args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--window-size=1200,800",
            format!("--user-data-dir={}", profile.display()),
        ]
    });
    if std::path::Path::new("/usr/bin/chromium").exists() {
        chrome["binary"] = "/usr/bin/chromium".into();
    }
    caps.insert("goog:chromeOptions".into(), chrome);
    let browser = until(
        Duration::from_secs(20),
        "chromedriver to accept a session",
        || {
            let (url, caps) = (url.clone(), caps.clone());
            async move {
                ClientBuilder::rustls()
                    .ok()?
                    .capabilities(caps)
                    .connect(&url)
                    .await
                    .ok()
            }
        },
    )
    .await;
    (driver, browser)
}

async fn text(b: &Browser, css: &str) -> String {
    b.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .expect("text")
}

#[tokio::test]
async fn the_dashboard_shows_the_queue_and_retries_a_dead_letter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(&dir.path().join("data"), &[]);
    let c = server.client().await;
    // The first (the one the stream takes) carries a producer's trace.
    let traced = EnqueueOptions::new()
        .metadata(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .metadata("request-id", "req-42");
    let plain = EnqueueOptions::new;
    for (i, opts) in [traced, plain(), plain()].into_iter().enumerate() {
        c.enqueue("emails", "send-email", format!("{{\"n\":{i}}}"), opts)
            .await
            .expect("enqueue");
    }
    // A job reclaimed once (its worker's stream dropped), then acked.
    let stream_job = {
        let mut stream = c
            .lease(["emails"], "w1", 1, Some(Duration::from_secs(60)))
            .await
            .expect("lease");
        let event = stream.message().await.expect("ok").expect("event");
        let Some(pb::lease_event::Event::Leased(l)) = event.event else {
            panic!("expected a leased job")
        };
        l.job.expect("job").id
    };
    let again = until(
        Duration::from_secs(10),
        "the job back and taken again",
        || {
            let (c, id) = (c.clone(), stream_job.clone());
            async move {
                let l = c.dequeue(["emails"], "w2", None, None).await.ok()??;
                let job = l.job.clone()?;
                if job.id == id {
                    Some(l)
                } else {
                    // Another job: give it back and keep looking.
                    c.fail(
                        job.id,
                        l.lease_id,
                        "not this one",
                        FailOptions::retry_after(Duration::ZERO),
                    )
                    .await
                    .ok()?;
                    None
                }
            }
        },
    )
    .await;
    // Its second run reported progress before its ack.
    c.heartbeat(
        "w2",
        vec![pb::LeaseRef {
            job_id: stream_job.clone(),
            lease_id: again.lease_id.clone(),
            progress: Some(pb::Progress {
                percent: 90,
                message: "rendered the receipt".into(),
                reported_at: None,
            }),
        }],
        None,
    )
    .await
    .expect("heartbeat");
    c.ack(stream_job.clone(), again.lease_id)
        .await
        .expect("ack");
    // A dead letter.
    let (dead, _) = c
        .enqueue(
            "emails",
            "send-email",
            "{}",
            EnqueueOptions::new().max_attempts(1).key("dead-1"),
        )
        .await
        .expect("enqueue");
    let l = until(Duration::from_secs(10), "the dead letter taken", || {
        let (c, id) = (c.clone(), dead.id.clone());
        async move {
            let l = c.dequeue(["emails"], "w3", None, None).await.ok()??;
            let job = l.job.clone()?;
            if job.id == id {
                Some(l)
            } else {
                c.fail(
                    job.id,
                    l.lease_id,
                    "not this one",
                    FailOptions::retry_after(Duration::ZERO),
                )
                .await
                .ok()?;
                None
            }
        }
    })
    .await;
    c.fail(
        dead.id.clone(),
        l.lease_id,
        "mailbox does not exist",
        FailOptions::retry(),
    )
    .await
    .expect("fail");

    let profile = tempfile::tempdir().expect("profile dir");
    let (_driver, b) = browser(profile.path()).await;
    let base = format!("http://{}", server.http);

    // Queues: the counts shown equal Stats.
    b.goto(&format!("{base}/")).await.expect("open /");
    let stats = c.stats(Some("emails")).await.expect("stats");
    let row = r#"tr[data-queue="emails"]"#;
    let shown = (
        text(&b, &format!("{row} td.pending")).await,
        text(&b, &format!("{row} td.running")).await,
        text(&b, &format!("{row} td.done")).await,
        text(&b, &format!("{row} td.failed")).await,
    );
    assert_eq!(
        shown,
        (
            stats[0].pending.to_string(),
            stats[0].running.to_string(),
            stats[0].done.to_string(),
            stats[0].failed.to_string()
        )
    );
    let shot = b.screenshot().await.expect("screenshot");
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-queues.png");
    std::fs::write(&path, &shot).expect("save the screenshot");
    assert!(shot.starts_with(b"\x89PNG"), "a PNG");
    eprintln!("screenshot: {}", path.display());

    // The reclaimed job's page shows both attempts.
    b.goto(&format!("{base}/jobs/{stream_job}"))
        .await
        .expect("job page");
    let job = c.get_job(stream_job.clone()).await.expect("get");
    let attempts = b
        .find_all(Locator::Css("#history li.attempt"))
        .await
        .expect("attempts");
    assert_eq!(attempts.len(), job.history.len());
    assert_eq!(attempts.len(), 2);
    assert_eq!(
        text(&b, "#trace-id").await,
        "0af7651916cd43dd8448eb211c80319c"
    );
    let progress = text(&b, "#progress").await;
    assert!(progress.contains("90% rendered the receipt"), "{progress}");
    let shot = b.screenshot().await.expect("screenshot");
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-job.png");
    std::fs::write(&path, &shot).expect("save the screenshot");
    eprintln!("screenshot: {}", path.display());
    let timeline = text(&b, "#history").await;
    assert!(timeline.contains("WORKER_DISCONNECTED"), "{timeline}");
    assert!(timeline.contains("ACKED"), "{timeline}");

    // Retry on a dead letter: PENDING, as `jobq get` confirms.
    b.goto(&format!("{base}/jobs?status=FAILED"))
        .await
        .expect("dead letters");
    b.find(Locator::Css(&format!(r#"tr[data-id="{}"] a"#, dead.id)))
        .await
        .expect("the dead letter is listed")
        .click()
        .await
        .expect("open it");
    b.find(Locator::Css("#retry"))
        .await
        .expect("a Retry button")
        .click()
        .await
        .expect("click Retry");
    until(Duration::from_secs(10), "the page to show PENDING", || {
        let b = b.clone();
        async move {
            let s = b
                .find(Locator::Css("#status"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            (s == "PENDING").then_some(())
        }
    })
    .await;
    let out = Command::new(JOBQ)
        .args(["--server", &server.url(), "--json", "get", &dead.id])
        .output()
        .expect("jobq get");
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(got["status"], "PENDING", "{got}");
    b.close().await.expect("close the browser");
}

/// Waits for an element `css` to be on the page (a click's navigation
/// may still be under way).
async fn shown(b: &Browser, css: &str, what: &str) {
    until(Duration::from_secs(10), what, || {
        let b = b.clone();
        async move { b.find(Locator::Css(css)).await.ok().map(|_| ()) }
    })
    .await;
}

/// With tokens on, a browser logs in through the form, gets a session
/// cookie its page scripts cannot read, and the Log out button ends the
/// session: the dashboard asks for a token again.
#[tokio::test]
async fn the_dashboard_logs_in_and_out_in_a_browser() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.toml");
    crate::pki::tokens_file(&tokens, &[("ops", "ops-secret", &["admin"], &["*"])]);
    let server = ServerProcess::start(
        &dir.path().join("data"),
        &["--auth-tokens", tokens.to_str().expect("path")],
    );
    let c = jobq_client::Client::builder(server.url())
        .token("ops-secret")
        .connect()
        .await
        .expect("connect");
    c.enqueue(
        "emails",
        "send-email",
        b"{}".to_vec(),
        EnqueueOptions::new(),
    )
    .await
    .expect("enqueue");

    let profile = tempfile::tempdir().expect("profile dir");
    let (_driver, b) = browser(profile.path()).await;
    let base = format!("http://{}", server.http);
    b.goto(&format!("{base}/")).await.expect("open /");
    b.find(Locator::Css("#token"))
        .await
        .expect("the login form")
        .send_keys("ops-secret")
        .await
        .expect("type the token");
    b.find(Locator::Css(r#"form[action="/login"] button"#))
        .await
        .expect("the Log in button")
        .click()
        .await
        .expect("log in");
    shown(
        &b,
        r#"tr[data-queue="emails"]"#,
        "the queues page, signed in",
    )
    .await;
    let cookies = b.get_all_cookies().await.expect("cookies");
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    assert_eq!(cookies[0].name(), "jobq_session");
    assert_ne!(cookies[0].value(), "ops-secret");
    assert_eq!(cookies[0].http_only(), Some(true));
    let script = b
        .execute("return document.cookie", vec![])
        .await
        .expect("run a script");
    assert_eq!(script, serde_json::json!(""), "scripts cannot read it");

    b.find(Locator::Css("#logout button"))
        .await
        .expect("a Log out button")
        .click()
        .await
        .expect("log out");
    shown(
        &b,
        r#"form[action="/login"]"#,
        "the login form after logging out",
    )
    .await;
    assert!(b.get_all_cookies().await.expect("cookies").is_empty());
    b.goto(&format!("{base}/")).await.expect("open / again");
    shown(&b, "#token", "logged out: the login form again").await;
    b.close().await.expect("close the browser");
}
