//! The tokens file, bearer headers and reloads.

use super::*;

fn tokens() -> Tokens {
    Tokens::parse(&format!(
        r#"
        [[token]]
        name = "mailer"
        sha256 = "{}"
        queues = ["emails", "billing.*"]
        roles = ["produce", "read"]

        [[token]]
        name = "ops"
        sha256 = "{}"
        queues = ["*"]
        roles = ["admin"]
        "#,
        digest_hex("s3cret"),
        digest_hex("root")
    ))
    .unwrap()
}

#[test]
fn a_secret_finds_its_token_and_roles_apply_per_queue() {
    let t = tokens();
    let mailer = t.find("s3cret").unwrap();
    assert_eq!(mailer.name(), "mailer");
    assert!(mailer.may(Role::Produce, "emails"));
    assert!(mailer.may(Role::Read, "billing.eu"));
    assert!(!mailer.may(Role::Produce, "billing"));
    assert!(!mailer.may(Role::Consume, "emails"));
    assert!(!mailer.may(Role::Admin, "emails"));
    let ops = t.find("root").unwrap();
    assert!(Role::ALL.iter().all(|&r| ops.may(r, "anything")));
    assert!(t.find("S3cret").is_none());
    assert!(t.find("").is_none());
}

#[test]
fn bad_files_are_refused_with_the_entry_named() {
    for (text, needle) in [
        ("[[token]]\nname='a'\nsha256='zz'\nqueues=[]\nroles=[]", "64 hex"),
        ("[[token]]\nname='a'\nsha256='00'\nqueues=[]\nroles=['root']", "unknown variant"),
        ("[[token]]\nname='a'\nqueues=[]\nroles=[]", "sha256"),
        ("[[token]]\nname='a'\nsha256='{d}'\nqueues=['[']\nroles=[]", "queues"),
        ("[[token]]\nname='a'\nsha256='{d}'\nqueues=[]\nroles=[]\n[[token]]\nname='a'\nsha256='{e}'\nqueues=[]\nroles=[]", "same name"),
        ("[[token]]\nname='a'\nsha256='{d}'\nqueues=[]\nroles=[]\n[[token]]\nname='b'\nsha256='{d}'\nqueues=[]\nroles=[]", "same secret"),
    ] {
        let text = text.replace("{d}", &digest_hex("x")).replace("{e}", &digest_hex("y"));
        let err = Tokens::parse(&text).unwrap_err().to_string();
        assert!(err.contains(needle), "{text}: {err}");
    }
}

#[test]
fn bearer_headers() {
    assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
    assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
    assert_eq!(bearer(Some("Basic abc")), None);
    assert_eq!(bearer(Some("Bearer ")), None);
    assert_eq!(bearer(Some("abc")), None);
    assert_eq!(bearer(None), None);
}

#[test]
fn a_reload_that_finds_no_token_keeps_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    let one = format!(
        "[[token]]\nname = 'a'\nsha256 = '{}'\nqueues = ['*']\nroles = ['read']\n",
        digest_hex("x")
    );
    std::fs::write(&path, &one).unwrap();
    let auth = Auth::from_file(&path).unwrap();
    // Caught half-written: truncated to nothing.
    std::fs::write(&path, "").unwrap();
    assert!(matches!(auth.reload(), Err(TokensError::Empty)));
    assert_eq!(auth.current().unwrap().len(), 1, "the old token stays");
    std::fs::write(&path, &one).unwrap();
    assert_eq!(auth.reload().unwrap(), 1);
}
