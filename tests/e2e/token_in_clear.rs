//! The CLI sends its token over plaintext `http://` only to this machine
//! (`localhost`, 127.0.0.0/8, `::1`), unless `--insecure` (or
//! `JOBQ_INSECURE`) says otherwise: refused before anything is sent.

use std::process::{Output, Stdio};

use crate::harness::{TestServer, JOBQ};

const TOKEN: &str = "token-do-not-send-in-clear-0123456789";

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A token goes over plaintext only to this machine unless `--insecure`
/// (or `JOBQ_INSECURE`) says otherwise. `0.0.0.0` is not a loopback
/// address, but Linux delivers connections to it locally: the same server
/// is reached either way.
#[tokio::test]
async fn the_cli_does_not_send_its_token_in_clear_to_another_machine() {
    let server = TestServer::start().await;
    let port = server.addr.port();
    let remote = format!("http://0.0.0.0:{port}");
    let local = format!("http://127.0.0.1:{port}");
    let run = |args: Vec<String>, env: Vec<(&'static str, String)>| async move {
        let mut cmd = tokio::process::Command::new(JOBQ);
        for var in ["JOBQ_SERVER", "JOBQ_TOKEN", "JOBQ_INSECURE"] {
            cmd.env_remove(var);
        }
        let out = cmd
            .args(&args)
            .envs(env)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run jobq");
        (out.status.code(), text(&out))
    };
    let args = |server: &str, extra: &[&str]| {
        let mut a = vec!["--server".to_owned(), server.to_owned()];
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        a.push("stats".to_owned());
        a
    };
    let (code, shown) = run(args(&remote, &["--token", TOKEN]), vec![]).await;
    assert_eq!(code, Some(1), "{shown}");
    assert!(
        shown.contains("refusing to send the token in clear to 0.0.0.0")
            && shown.contains("--insecure"),
        "{shown}"
    );
    assert!(!shown.contains(TOKEN), "{shown}");
    // From the environment, as a worker's deployment would set it.
    let env = vec![("JOBQ_TOKEN", TOKEN.to_owned())];
    let (code, shown) = run(args(&remote, &[]), env).await;
    assert_eq!(code, Some(1), "{shown}");
    assert!(
        shown.contains("refusing to send the token in clear"),
        "{shown}"
    );
    // Said so: the call goes through.
    for (extra, env) in [
        (&["--token", TOKEN, "--insecure"][..], vec![]),
        (
            &["--token", TOKEN][..],
            vec![("JOBQ_INSECURE", "true".to_owned())],
        ),
    ] {
        let (code, shown) = run(args(&remote, extra), env).await;
        assert_eq!(code, Some(0), "{extra:?}: {shown}");
    }
    // To this machine, and without a token, nothing to say.
    let (code, shown) = run(args(&local, &["--token", TOKEN]), vec![]).await;
    assert_eq!(code, Some(0), "{shown}");
    let (code, shown) = run(args(&remote, &[]), vec![]).await;
    assert_eq!(code, Some(0), "{shown}");
    server.stop().await;
}
