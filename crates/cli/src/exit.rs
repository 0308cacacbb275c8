//! The one place errors become exit codes and stderr text.
//!
//! - 0: success, and also a closed stdout (`jobq list | head`), but not a
//!   call whose connection broke (also a broken pipe).
//! - 1: a failed call. A gRPC refusal prints `error: <CODE>: <message>`
//!   (`error: NOT_FOUND: job 42 not found`); anything else prints the
//!   error's chain.
//! - 2: a usage error. clap exits with 2 itself while parsing; checks made
//!   after parsing return [`usage`](crate::cli::usage) errors, which land
//!   here.

use std::process::ExitCode;

/// Prints `err` to stderr and picks the exit code.
pub fn report(err: &anyhow::Error) -> ExitCode {
    if let Some(clap_err) = err.downcast_ref::<clap::Error>() {
        let _ = clap_err.print();
        return ExitCode::from(u8::try_from(clap_err.exit_code()).unwrap_or(2));
    }
    if is_broken_pipe(err) {
        return ExitCode::SUCCESS;
    }
    // A call that got no reply names the server and the cause in one
    // line; the status tonic made up for it says neither.
    if let Some(no_reply) = no_reply(err) {
        eprintln!("error: {no_reply}");
        return ExitCode::FAILURE;
    }
    match status_of(err) {
        Some(status) => eprintln!("error: {}", status_text(status)),
        None => eprintln!("error: {err:#}"),
    }
    ExitCode::FAILURE
}

/// `<CODE>: <message>` for a gRPC status.
pub fn status_text(status: &tonic::Status) -> String {
    format!("{}: {}", jobq::code_name(status.code()), status.message())
}

/// `<CODE>: <message>` when `err` is a gRPC refusal, else its chain.
pub fn client_error_text(err: &jobq_client::Error) -> String {
    match err {
        jobq_client::Error::Status(status) => status_text(status),
        other => other.to_string(),
    }
}

/// The call inside `err` that got no reply, if one did.
fn no_reply(err: &anyhow::Error) -> Option<&jobq_client::Error> {
    err.chain()
        .filter_map(|cause| cause.downcast_ref::<jobq_client::Error>())
        .find(|e| matches!(e, jobq_client::Error::NoReply { .. }))
}

/// The gRPC status inside `err`, if a call failed with one.
fn status_of(err: &anyhow::Error) -> Option<&tonic::Status> {
    err.chain().find_map(|cause| {
        if let Some(jobq_client::Error::Status(status)) = cause.downcast_ref() {
            return Some(status);
        }
        cause.downcast_ref::<tonic::Status>()
    })
}

/// A closed stdout (`jobq list | head`): a broken pipe that is not a
/// call's. A connection to the server broken mid-call also ends in a
/// broken pipe, inside the call's error: that call failed, and its caller
/// must hear so (an enqueue that got no reply may not have happened).
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    let a_call = err.chain().any(|cause| {
        cause.is::<jobq_client::Error>()
            || cause.is::<tonic::Status>()
            || cause.is::<tonic::transport::Error>()
    });
    !a_call
        && err.chain().any(|cause| {
            cause
                .downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_errors_print_their_code() {
        let err = anyhow::Error::from(jobq_client::Error::from(tonic::Status::not_found(
            "job 9 not found",
        )));
        assert_eq!(
            status_of(&err).map(status_text).as_deref(),
            Some("NOT_FOUND: job 9 not found")
        );
    }

    #[test]
    fn a_call_without_a_reply_names_the_server() {
        let err = anyhow::Error::from(jobq_client::Error::NoReply {
            url: "http://10.0.0.7:50051".into(),
            code: tonic::Code::Unavailable,
            cause: "Connection refused (os error 111)".into(),
            status: tonic::Status::unavailable("tcp connect error"),
        });
        let found = no_reply(&err).expect("the call without a reply");
        assert_eq!(
            found.to_string(),
            "no reply from http://10.0.0.7:50051 (Unavailable): Connection refused (os error 111)"
        );
        assert_eq!(report(&err), ExitCode::FAILURE);
    }

    #[test]
    fn usage_errors_exit_2() {
        let err = crate::cli::usage("pick one");
        assert_eq!(err.downcast_ref::<clap::Error>().unwrap().exit_code(), 2);
    }

    #[test]
    fn broken_pipe_is_quiet() {
        let err = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(is_broken_pipe(&err));
    }

    #[test]
    fn a_call_cut_by_a_broken_connection_is_an_error() {
        let cut = tonic::Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::BrokenPipe,
        )));
        let err = anyhow::Error::from(jobq_client::Error::from(cut)).context("enqueue");
        assert!(!is_broken_pipe(&err));
        assert_eq!(report(&err), ExitCode::FAILURE);
    }
}
