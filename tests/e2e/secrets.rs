//! Secrets stay out of what jobq prints: `--help` does not show the values
//! of environment variables that may hold one (the store's URL, tokens,
//! the OTLP endpoint), and the store's password is `***` in every log
//! line, error, page and metric, whatever form it was written in.
//!
//! `a_server_on_postgres_shows_its_store_without_the_password` needs the
//! PostgreSQL cluster of `scripts/pg-test.sh` (`JOBQ_TEST_PG`).

use std::process::{Command, Output, Stdio};

use jobq_server::store::postgres::testing;

use crate::harness::{http_get, ServerProcess, JOBQ};

const PASSWORD: &str = "hunter2-do-not-print";
const TOKEN: &str = "token-do-not-print-0123456789";

/// `jobq ARGS` with no connection settings of the caller's environment.
fn jobq(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(JOBQ);
    for var in [
        "JOBQ_SERVER",
        "JOBQ_TOKEN",
        "JOBQ_INSECURE",
        "JOBQ_STORE",
        "JOBQ_OTLP_ENDPOINT",
    ] {
        cmd.env_remove(var);
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run jobq")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn help_does_not_print_secret_environment_values() {
    let store = format!("postgres://jobq:{PASSWORD}@db.internal/jobs");
    let otlp = format!("http://collector:{PASSWORD}@otel.internal:4317");
    let env = [
        ("JOBQ_STORE", store.as_str()),
        ("JOBQ_TOKEN", TOKEN),
        ("JOBQ_OTLP_ENDPOINT", otlp.as_str()),
    ];
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["migrate", "--help"],
        &["stats", "--help"],
        &["work", "--help"],
    ] {
        let out = jobq(args, &env);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        let shown = text(&out);
        assert!(
            !shown.contains(PASSWORD) && !shown.contains(TOKEN),
            "{args:?} printed a secret:\n{shown}"
        );
    }
    // The variables are still named, without their values.
    let shown = text(&jobq(&["serve", "--help"], &env));
    assert!(shown.contains("[env: JOBQ_STORE]"), "{shown}");
}

/// Every form of the password, in a connection string to a port where
/// nothing listens: `jobq migrate` fails, and its error shows where it
/// tried without the password.
#[test]
fn migrate_errors_show_the_store_without_its_password() {
    let port = crate::harness::free_port();
    for store in [
        format!("postgres://jobq:{PASSWORD}@127.0.0.1:{port}/jobs"),
        format!("postgres://jobq@127.0.0.1:{port}/jobs?password={PASSWORD}"),
        format!("host=127.0.0.1 port={port} user=jobq password={PASSWORD} dbname=jobs"),
        format!("host=127.0.0.1 port={port} user=jobq password='{PASSWORD} x' dbname=jobs"),
    ] {
        for out in [
            jobq(&["migrate", "--store", &store], &[]),
            jobq(&["migrate"], &[("JOBQ_STORE", &store)]),
        ] {
            assert!(!out.status.success(), "{store}");
            let shown = text(&out);
            assert!(!shown.contains(PASSWORD), "{store}:\n{shown}");
            assert!(
                shown.contains(&format!("postgres://jobq:***@127.0.0.1:{port}/jobs")),
                "{store}:\n{shown}"
            );
        }
    }
}

#[tokio::test]
async fn a_server_on_postgres_shows_its_store_without_the_password() {
    let url = testing::fresh_database("jobq_secrets").await;
    // The test cluster trusts local connections: the password is given,
    // and ignored by PostgreSQL, only to be hidden by jobq.
    let sep = if url.contains('?') { '&' } else { '?' };
    let store = format!("{url}{sep}password={PASSWORD}");
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with(dir.path(), "127.0.0.1:0", &[], |cmd| {
        cmd.env("JOBQ_STORE", &store);
    });
    assert!(server.logged(":***@"), "the store is logged, redacted");
    assert!(!server.logged(PASSWORD), "the password was logged");
    for path in ["/", "/metrics"] {
        let (status, body) = http_get(server.http, path).await;
        assert_eq!(status, 200, "{path}");
        assert!(!body.contains(PASSWORD), "{path}: {body}");
    }
}
