//! File descriptors kept for the store.
//!
//! Every accepted connection is a file descriptor; so is every sled file,
//! every PostgreSQL connection and every payload file the store opens. A
//! store that cannot open a file when it flushes fail-stops the server, so
//! connections must never be able to take the last descriptors. The
//! design:
//!
//! - at start the soft `RLIMIT_NOFILE` is raised to the hard limit (the
//!   most an unprivileged process may have; [`raise_limit`]);
//! - `--reserved-fds` (default a quarter of the limit, at least
//!   [`MIN_RESERVED_FDS`]) are kept out of both listeners' reach;
//! - the two connection caps share what is left ([`budget`]): unset, the
//!   HTTP listener gets [`DEFAULT_HTTP_MAX_CONNECTIONS`] (a quarter of it
//!   when that is less) and gRPC the rest; set, they must fit, or the
//!   server refuses to start, naming the flags. Refusing rather than
//!   clamping: a cap the operator wrote is never silently a different one.
//!
//! Each listener closes a connection over its cap as soon as it is
//! accepted (connections.rs), so together they hold at most their caps
//! plus one descriptor each, momentarily.

use crate::config::Config;

/// The fewest descriptors kept for the store and the rest of the server.
pub const MIN_RESERVED_FDS: u64 = 64;

/// `--http-max-connections` when unset and the fd limit allows it: far
/// more than a dashboard and a few scrapers need.
pub const DEFAULT_HTTP_MAX_CONNECTIONS: usize = 256;

/// The largest limit the arithmetic below counts with (Linux's default
/// `nr_open`); a larger or infinite hard limit counts as this.
const LARGEST_LIMIT: u64 = 1 << 20;

/// How the process's descriptors are shared out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The soft `RLIMIT_NOFILE` in force.
    pub limit: u64,
    /// Kept out of both listeners' reach.
    pub reserved: u64,
    /// `--max-connections`, given or derived.
    pub max_connections: usize,
    /// `--http-max-connections`, given or derived (0: no HTTP listener).
    pub http_max_connections: usize,
}

fn get_limit() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and nothing else.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit)
}

/// Raises the soft fd limit to the hard one (at most [`LARGEST_LIMIT`]);
/// returns the soft limit now in force. A failure keeps the old one, with
/// a warning.
pub fn raise_limit() -> u64 {
    let Some(limit) = get_limit() else {
        tracing::warn!("cannot read the fd limit (RLIMIT_NOFILE); counting with 1024");
        return 1024;
    };
    let target = limit.rlim_max.min(LARGEST_LIMIT);
    if limit.rlim_cur >= target {
        return limit.rlim_cur.min(LARGEST_LIMIT);
    }
    let raised = libc::rlimit {
        rlim_cur: target,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads the struct we pass; raising the soft limit up
    // to the hard one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
        target
    } else {
        let err = std::io::Error::last_os_error();
        tracing::warn!(%err, soft = limit.rlim_cur, hard = limit.rlim_max, "cannot raise the soft fd limit to the hard one");
        limit.rlim_cur
    }
}

/// Shares `limit` descriptors out between the reserve and the two
/// listeners' caps, from `config`'s flags.
///
/// # Errors
/// When the given flags do not fit in `limit`, naming them.
pub fn budget(limit: u64, config: &Config) -> Result<Budget, String> {
    let limit = limit.min(LARGEST_LIMIT);
    // PostgreSQL's pool is the store's own use of descriptors.
    let pool = if config.store.is_some() {
        u64::try_from(config.pg_pool_size).unwrap_or(u64::MAX)
    } else {
        0
    };
    let least = MIN_RESERVED_FDS.saturating_add(pool);
    let reserved = config.reserved_fds.unwrap_or_else(|| least.max(limit / 4));
    if reserved < least {
        return Err(format!(
            "--reserved-fds {reserved} is under the least the store needs, {least} ({MIN_RESERVED_FDS}, plus --pg-pool-size with --store)"
        ));
    }
    let fix = "lower them, or raise the fd limit (`ulimit -n`, systemd's LimitNOFILE=)";
    if reserved >= limit {
        return Err(format!(
            "--reserved-fds {reserved} leaves no file descriptor for connections under the fd limit {limit} (RLIMIT_NOFILE); {fix}"
        ));
    }
    let usable = usize::try_from(limit - reserved).unwrap_or(usize::MAX);
    let http = match (config.http_listen.0, config.http_max_connections) {
        (None, _) => 0,
        (Some(_), Some(given)) => given,
        (Some(_), None) => DEFAULT_HTTP_MAX_CONNECTIONS.min(usable / 4).max(1),
    };
    if config.http_listen.0.is_some() && http == 0 {
        return Err("--http-max-connections must be at least 1".into());
    }
    let grpc = match config.max_connections {
        Some(0) => return Err("--max-connections must be at least 1".into()),
        Some(given) => given,
        None if usable > http => usable - http,
        None => {
            return Err(format!(
                "--http-max-connections {http} and --reserved-fds {reserved} leave no file descriptor for gRPC connections under the fd limit {limit} (RLIMIT_NOFILE); {fix}"
            ))
        }
    };
    if grpc.saturating_add(http) > usable {
        return Err(format!(
            "--max-connections {grpc} + --http-max-connections {http} + --reserved-fds {reserved} is over the fd limit {limit} (RLIMIT_NOFILE, raised to its hard limit): connections could take the descriptors the store needs to stay up; {fix}"
        ));
    }
    Ok(Budget {
        limit,
        reserved,
        max_connections: grpc,
        http_max_connections: http,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HttpListen;

    fn config(http: bool) -> Config {
        let mut config = Config::with_data("/nonexistent");
        config.max_connections = None;
        config.http_max_connections = None;
        config.reserved_fds = None;
        if http {
            config.http_listen = HttpListen(Some("127.0.0.1:0".parse().unwrap()));
        }
        config
    }

    #[test]
    fn unset_caps_share_what_the_reserve_leaves() {
        let b = budget(1024, &config(true)).unwrap();
        assert_eq!(b.reserved, 256);
        assert_eq!(b.http_max_connections, 192);
        assert_eq!(b.max_connections, 1024 - 256 - 192);
        let b = budget(20_000, &config(true)).unwrap();
        assert_eq!(b.http_max_connections, DEFAULT_HTTP_MAX_CONNECTIONS);
        assert_eq!(b.max_connections as u64 + 256 + b.reserved, 20_000);
        let b = budget(1024, &config(false)).unwrap();
        assert_eq!(b.http_max_connections, 0);
        assert_eq!(b.max_connections, 768);
        // An infinite hard limit counts as 2^20.
        let b = budget(u64::MAX, &config(true)).unwrap();
        assert_eq!(b.limit, LARGEST_LIMIT);
    }

    #[test]
    fn caps_that_would_eat_the_reserve_are_refused_with_their_flags() {
        let mut c = config(true);
        c.max_connections = Some(10_000);
        let err = budget(1024, &c).unwrap_err();
        assert!(
            err.contains("--max-connections 10000") && err.contains("--reserved-fds 256"),
            "{err}"
        );
        let mut c = config(true);
        c.reserved_fds = Some(2000);
        assert!(budget(1024, &c)
            .unwrap_err()
            .contains("--reserved-fds 2000"));
        let mut c = config(true);
        c.http_max_connections = Some(0);
        assert!(budget(1024, &c).is_err());
        let mut c = config(true);
        c.reserved_fds = Some(10);
        assert!(budget(1024, &c).unwrap_err().contains("--reserved-fds 10"));
        c.store = Some("postgres://localhost/jobq".into());
        c.pg_pool_size = 100;
        c.reserved_fds = Some(100);
        assert!(budget(1024, &c).unwrap_err().contains("--pg-pool-size"));
        c.reserved_fds = None;
        assert_eq!(budget(100_000, &c).unwrap().reserved, 25_000);
        assert_eq!(budget(256, &c).unwrap().reserved, 164);
        let mut c = config(true);
        c.max_connections = Some(500);
        c.http_max_connections = Some(200);
        c.reserved_fds = Some(64);
        let b = budget(1024, &c).unwrap();
        assert_eq!((b.max_connections, b.http_max_connections), (500, 200));
    }
}
