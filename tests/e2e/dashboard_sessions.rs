//! Dashboard logins with tokens on: the cookie names an opaque server-side
//! session, never the token; it is HttpOnly and SameSite=Strict, `Secure`
//! with the `__Host-` prefix behind TLS, expires, ends at logout, and
//! ends when its token is revoked.

use std::time::Duration;

use crate::{
    harness::{http, signal, until, ServerProcess},
    pki::tokens_file,
};

const FORM: (&str, &str) = ("Content-Type", "application/x-www-form-urlencoded");

/// The `Set-Cookie` header of a response head.
fn set_cookie(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("set-cookie")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no Set-Cookie in {head}"))
}

/// Logs in with `secret`: the whole `Set-Cookie` value.
async fn login(server: &ServerProcess, secret: &str) -> String {
    let (status, head, _) = http(
        server.http,
        "POST",
        "/login",
        &[FORM],
        &format!("token={secret}"),
    )
    .await;
    assert_eq!(status, 303, "{head}");
    set_cookie(&head)
}

/// `name=value`, the part of a `Set-Cookie` a browser sends back.
fn pair(cookie: &str) -> String {
    cookie.split(';').next().unwrap().trim().to_owned()
}

async fn get_with(server: &ServerProcess, cookie: &str) -> (u16, String) {
    let (status, _, body) = http(server.http, "GET", "/", &[("Cookie", cookie)], "").await;
    (status, body)
}

fn start(dir: &std::path::Path, extra: &[&str]) -> (ServerProcess, std::path::PathBuf) {
    let tokens = dir.join("tokens.toml");
    tokens_file(
        &tokens,
        &[
            ("ops", "ops-secret", &["admin"], &["*"]),
            ("viewer", "viewer-secret", &["read"], &["*"]),
        ],
    );
    let mut args = vec!["--auth-tokens", tokens.to_str().unwrap()];
    args.extend_from_slice(extra);
    (ServerProcess::start(&dir.join("data"), &args), tokens)
}

#[tokio::test]
async fn the_login_cookie_is_an_opaque_session_that_logout_ends() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), &[]);
    let cookie = login(&server, "viewer-secret").await;
    let attrs: Vec<&str> = cookie.split(';').map(str::trim).collect();
    let (name, id) = attrs[0].split_once('=').expect("name=value");
    assert_eq!(name, "jobq_session", "{cookie}");
    // 256 random bits, hex; the token is nowhere in it.
    assert_eq!(id.len(), 64, "{cookie}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{cookie}");
    assert!(!cookie.contains("viewer-secret"), "{cookie}");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(attrs.contains(&attr), "{attr} missing: {cookie}");
    }
    // Plain HTTP: a Secure cookie would never be sent back.
    assert!(!attrs.contains(&"Secure"), "{cookie}");
    // Each login is a session of its own.
    let other = login(&server, "viewer-secret").await;
    assert_ne!(pair(&cookie), pair(&other));

    let session = pair(&cookie);
    let (status, body) = get_with(&server, &session).await;
    assert_eq!(status, 200);
    assert!(
        body.contains(r#"action="/logout""#),
        "a Log out button: {body}"
    );
    // The old cookie, the raw token, is no longer a way in.
    let (status, _) = get_with(&server, "jobq_token=viewer-secret").await;
    assert_eq!(status, 401);
    let (status, _) = get_with(&server, "jobq_session=viewer-secret").await;
    assert_eq!(status, 401);

    // Logout: the session ends on the server, the cookie is deleted.
    let (status, head, _) = http(server.http, "POST", "/logout", &[("Cookie", &session)], "").await;
    assert_eq!(status, 303, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("location: /login"),
        "{head}"
    );
    let cleared = set_cookie(&head);
    assert!(
        cleared.starts_with("jobq_session=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
    // A copy of the cookie taken before the logout is refused.
    let (status, body) = get_with(&server, &session).await;
    assert_eq!(status, 401);
    assert!(body.contains(r#"action="/login""#), "{body}");
    // The other login is untouched.
    assert_eq!(get_with(&server, &pair(&other)).await.0, 200);
    // A logout without a session, or with a bad one, changes nothing.
    for cookie in ["", "jobq_session=nonsense"] {
        let (status, _, _) = http(server.http, "POST", "/logout", &[("Cookie", cookie)], "").await;
        assert_eq!(status, 303);
    }
    assert_eq!(get_with(&server, &pair(&other)).await.0, 200);
    // GET does not log out.
    let (status, _, _) = http(
        server.http,
        "GET",
        "/logout",
        &[("Cookie", &pair(&other))],
        "",
    )
    .await;
    assert_eq!(status, 405);
    assert_eq!(get_with(&server, &pair(&other)).await.0, 200);
}

#[tokio::test]
async fn a_session_expires_after_its_lifetime() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), &["--http-session-lifetime", "2s"]);
    let cookie = login(&server, "ops-secret").await;
    assert!(cookie.contains("Max-Age=2"), "{cookie}");
    let session = pair(&cookie);
    assert_eq!(get_with(&server, &session).await.0, 200);
    until(Duration::from_secs(20), "the session to expire", || async {
        (get_with(&server, &session).await.0 == 401).then_some(())
    })
    .await;
}

#[tokio::test]
async fn behind_tls_the_cookie_is_secure_with_the_host_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), &["--http-behind-tls"]);
    let cookie = login(&server, "ops-secret").await;
    let attrs: Vec<&str> = cookie.split(';').map(str::trim).collect();
    assert!(attrs[0].starts_with("__Host-jobq_session="), "{cookie}");
    for attr in ["Secure", "HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(attrs.contains(&attr), "{attr} missing: {cookie}");
    }
    assert!(!cookie.contains("Domain"), "{cookie}");
    assert_eq!(get_with(&server, &pair(&cookie)).await.0, 200);
    // The plain-HTTP name is not read here.
    let plain = pair(&cookie).replace("__Host-", "");
    assert_eq!(get_with(&server, &plain).await.0, 401);
}

#[tokio::test]
async fn a_revoked_token_ends_its_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let (server, tokens) = start(dir.path(), &[]);
    let viewer = pair(&login(&server, "viewer-secret").await);
    let ops = pair(&login(&server, "ops-secret").await);
    tokens_file(&tokens, &[("ops", "ops-secret", &["admin"], &["*"])]);
    signal(&server.child, libc::SIGHUP);
    until(
        Duration::from_secs(20),
        "the revoked token's session to end",
        || async { (get_with(&server, &viewer).await.0 == 401).then_some(()) },
    )
    .await;
    assert_eq!(get_with(&server, &ops).await.0, 200);
}

#[tokio::test]
async fn too_many_sessions_refuse_a_login_until_one_ends() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(dir.path(), &["--http-max-sessions", "2"]);
    let first = pair(&login(&server, "ops-secret").await);
    login(&server, "ops-secret").await;
    let (status, _, body) = http(server.http, "POST", "/login", &[FORM], "token=ops-secret").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("too many dashboard sessions"), "{body}");
    // The sessions already open are untouched; a logout makes room.
    assert_eq!(get_with(&server, &first).await.0, 200);
    http(server.http, "POST", "/logout", &[("Cookie", &first)], "").await;
    login(&server, "ops-secret").await;
}
