//! The PostgreSQL connection string as it may be shown: in logs, error
//! messages, `jobq` output, the dashboard and metrics labels.
//!
//! The password can be in the URL's userinfo (`postgres://u:pw@h/db`), in
//! its query (`?password=pw`), or a `password=` (quoted or not) of a
//! key/value string; rather than finding each form by hand, the string is
//! parsed as the driver parses it, and shown from the parsed settings
//! that are not secret: user, hosts and ports, database and application
//! name. A password shows as `***`; nothing else is shown. A string that
//! does not parse is not shown at all.

use std::fmt::Write;

use tokio_postgres::config::{Config, Host};

/// What is shown for a connection string the driver cannot parse (it may
/// hold a password anywhere).
pub const UNPARSEABLE: &str = "<a PostgreSQL connection string that does not parse>";

/// `dsn` (a URL or a key/value string) without its password, as a
/// `postgres://` URL: `postgres://user:***@host:port/db` (a URL without a
/// port shows the driver's default, 5432).
pub fn redact(dsn: &str) -> String {
    match dsn.parse::<Config>() {
        Ok(config) => shown(&config),
        Err(_) => UNPARSEABLE.to_owned(),
    }
}

fn shown(config: &Config) -> String {
    let mut out = String::from("postgres://");
    if let Some(user) = config.get_user() {
        out.push_str(&escape(user));
    }
    if config.get_password().is_some() {
        out.push_str(":***");
    }
    if config.get_user().is_some() || config.get_password().is_some() {
        out.push('@');
    }
    let ports = config.get_ports();
    // One port for every host, or one for all of them.
    let port = |i: usize| ports.get(i).or(ports.first().filter(|_| ports.len() == 1));
    let mut sockets = Vec::new();
    let mut first = true;
    for (i, host) in config.get_hosts().iter().enumerate() {
        match host {
            Host::Tcp(name) => {
                if !first {
                    out.push(',');
                }
                first = false;
                if name.contains(':') {
                    let _ = write!(out, "[{name}]");
                } else {
                    out.push_str(&escape(name));
                }
                if let Some(p) = port(i) {
                    let _ = write!(out, ":{p}");
                }
            }
            #[cfg(unix)]
            Host::Unix(path) => sockets.push(path.display().to_string()),
        }
    }
    out.push('/');
    if let Some(db) = config.get_dbname() {
        out.push_str(&escape(db));
    }
    let mut query: Vec<String> = sockets.iter().map(|s| format!("host={s}")).collect();
    // No TCP host to carry it (a Unix socket's name has the port too).
    if first && ports.len() == 1 {
        query.push(format!("port={}", ports[0]));
    }
    if let Some(name) = config.get_application_name() {
        query.push(format!("application_name={}", escape(name)));
    }
    if !query.is_empty() {
        out.push('?');
        out.push_str(&query.join("&"));
    }
    out
}

/// Percent-encodes what would change the URL's shape.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            ':' | '@' | '/' | '?' | '#' | '&' | '=' | ',' | '%' | '[' | ']' | ' ' => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "%{b:02X}");
                }
            }
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "%{b:02X}");
                }
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way of writing the password, and what is shown for it.
    const FORMS: &[(&str, &str)] = &[
        // URL userinfo, plain and percent-encoded.
        (
            "postgres://jobq:hunter2@db.internal:5432/jobs",
            "postgres://jobq:***@db.internal:5432/jobs",
        ),
        (
            "postgresql://jobq:hun%40ter2@db.internal/jobs",
            "postgres://jobq:***@db.internal:5432/jobs",
        ),
        // URL query.
        (
            "postgres://jobq@db.internal/jobs?password=hunter2&application_name=jobq",
            "postgres://jobq:***@db.internal:5432/jobs?application_name=jobq",
        ),
        (
            "postgres://db.internal/jobs?user=jobq&password=hun%20ter2",
            "postgres://jobq:***@db.internal:5432/jobs",
        ),
        // Both: the query wins, neither is shown.
        (
            "postgres://jobq:hunter1@db.internal/jobs?password=hunter2",
            "postgres://jobq:***@db.internal:5432/jobs",
        ),
        // Key/value, bare and quoted (with spaces and an escaped quote).
        (
            "host=db.internal port=5432 user=jobq password=hunter2 dbname=jobs",
            "postgres://jobq:***@db.internal:5432/jobs",
        ),
        (
            "host=db.internal user=jobq password='hun ter2' dbname=jobs",
            "postgres://jobq:***@db.internal/jobs",
        ),
        (
            r"password='hun\'ter2' host=db.internal user=jobq",
            "postgres://jobq:***@db.internal/",
        ),
        (
            "user = jobq password = hunter2 host = db.internal",
            "postgres://jobq:***@db.internal/",
        ),
        // Several hosts, IPv6, a Unix socket.
        (
            "postgres://jobq:hunter2@db1:5432,db2:5433/jobs",
            "postgres://jobq:***@db1:5432,db2:5433/jobs",
        ),
        (
            "postgres://jobq:hunter2@[::1]:5432/jobs",
            "postgres://jobq:***@[::1]:5432/jobs",
        ),
        (
            "postgres://jobq:hunter2@%2Fvar%2Frun%2Fpostgresql/jobs",
            "postgres://jobq:***@/jobs?host=/var/run/postgresql&port=5432",
        ),
        (
            "host=/var/run/postgresql user=jobq password=hunter2",
            "postgres://jobq:***@/?host=/var/run/postgresql",
        ),
        // No password: nothing to hide.
        (
            "postgres://jobq@127.0.0.1:5432/postgres",
            "postgres://jobq@127.0.0.1:5432/postgres",
        ),
    ];

    #[test]
    fn the_password_is_never_shown_whatever_its_form() {
        let mut wrong = Vec::new();
        for (dsn, want) in FORMS {
            let got = redact(dsn);
            if ["hunter", "hun%", "ter2"].iter().any(|s| got.contains(s)) || &got != want {
                wrong.push(format!("{dsn}\n  shown as {got}\n  want     {want}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn a_string_that_does_not_parse_is_not_shown() {
        for dsn in [
            "postgres://jobq:hunter2@db.internal:notaport/jobs",
            "host=db.internal password='hunter2",
            "password=hunter2 sslmode=sometimes",
            "postgres://jobq:hunter2@db.internal/jobs?password",
        ] {
            assert_eq!(redact(dsn), UNPARSEABLE, "{dsn}");
        }
    }

    #[test]
    fn names_that_would_change_the_urls_shape_are_escaped() {
        let got = redact("user='a@b:c' password=x host=h dbname='d/e?f'");
        assert_eq!(got, "postgres://a%40b%3Ac:***@h/d%2Fe%3Ff");
    }
}
