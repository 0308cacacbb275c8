//! Tokens end to end: a real server on 127.0.0.1:0 with an
//! `--auth-tokens` file, called over gRPC with `authorization: Bearer`.
//!
//! - `every_rpc_by_every_role_in_and_out_of_its_queues`: the matrix, every
//!   RPC × role × a queue the token covers and one it does not.
//! - no token and unknown tokens are UNAUTHENTICATED on every RPC; health
//!   and reflection stay open.
//! - a lease belongs to the token that took it.
//! - a job or schedule of a queue the token may not read looks missing:
//!   the same NOT_FOUND as an id or name that names nothing.
//! - Stats without a queue and ListSchedules show only the token's
//!   queues; ListJobs across queues needs read on every queue.

use jobq::pb;
use tonic::{transport::Channel, Code, Request};

mod common;

use common::{code, req, Cli, TestServer, TOKENS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    Enqueue,
    EnqueueBatch,
    Dequeue,
    Lease,
    Ack,
    Fail,
    Heartbeat,
    Retry,
    GetJob,
    ListJobs,
    Stats,
    CancelJob,
    PauseQueue,
    ResumeQueue,
    DeleteJob,
    PurgeJobs,
    CreateSchedule,
    DeleteSchedule,
}

const RPCS: [Rpc; 18] = [
    Rpc::Enqueue,
    Rpc::EnqueueBatch,
    Rpc::Dequeue,
    Rpc::Lease,
    Rpc::Ack,
    Rpc::Fail,
    Rpc::Heartbeat,
    Rpc::Retry,
    Rpc::GetJob,
    Rpc::ListJobs,
    Rpc::Stats,
    Rpc::CancelJob,
    Rpc::PauseQueue,
    Rpc::ResumeQueue,
    Rpc::DeleteJob,
    Rpc::PurgeJobs,
    Rpc::CreateSchedule,
    Rpc::DeleteSchedule,
];

/// The role an RPC needs (admin may do everything).
fn needs(rpc: Rpc) -> &'static str {
    match rpc {
        Rpc::Enqueue | Rpc::EnqueueBatch => "produce",
        Rpc::Dequeue | Rpc::Lease | Rpc::Ack | Rpc::Fail | Rpc::Heartbeat => "consume",
        Rpc::GetJob | Rpc::ListJobs | Rpc::Stats => "read",
        Rpc::Retry
        | Rpc::CancelJob
        | Rpc::PauseQueue
        | Rpc::ResumeQueue
        | Rpc::DeleteJob
        | Rpc::PurgeJobs
        | Rpc::CreateSchedule
        | Rpc::DeleteSchedule => "admin",
    }
}

fn enqueue_req(queue: &str, max_attempts: u32) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        queue: queue.into(),
        kind: "k".into(),
        payload: b"p".to_vec(),
        max_attempts,
        ..Default::default()
    }
}

/// A schedule on `queue` that does not tick during a test.
fn yearly(queue: &str) -> pb::CreateScheduleRequest {
    pb::CreateScheduleRequest {
        name: format!("s-{queue}"),
        queue: queue.into(),
        kind: "k".into(),
        cron: "0 0 1 1 *".into(),
        ..Default::default()
    }
}

async fn enqueue(c: &mut Cli, queue: &str, as_: &str) -> String {
    let r = c
        .enqueue(req(enqueue_req(queue, 1), Some(as_)))
        .await
        .unwrap();
    r.into_inner().job.unwrap().id
}

/// Enqueues into `queue` and leases it as `as_`: (job id, lease id).
async fn leased(c: &mut Cli, queue: &str, as_: &str) -> (String, String) {
    enqueue(c, queue, "root").await;
    let r = c
        .dequeue(req(
            pb::DequeueRequest {
                queues: vec![queue.into()],
                worker_id: format!("w-{as_}"),
                ..Default::default()
            },
            Some(as_),
        ))
        .await
        .unwrap()
        .into_inner();
    let l = r.leased.expect("a job is due");
    (l.job.unwrap().id, l.lease_id)
}

/// Calls `rpc` on `queue` as `token`, after setting up what it needs.
async fn call(c: &mut Cli, rpc: Rpc, queue: &str, token: Option<&str>) -> Code {
    // Leases for Ack/Fail/Heartbeat are taken by the caller when it could,
    // so that only the role and queue decide; else by root.
    let taker = match token {
        Some(t @ ("consumer" | "admin")) if queue.starts_with("in.") => t,
        _ => "root",
    };
    match rpc {
        Rpc::Enqueue => code(c.enqueue(req(enqueue_req(queue, 0), token)).await),
        Rpc::EnqueueBatch => code(
            c.enqueue_batch(req(
                pb::EnqueueBatchRequest {
                    jobs: vec![enqueue_req(queue, 0), enqueue_req(queue, 0)],
                },
                token,
            ))
            .await,
        ),
        Rpc::Dequeue => code(
            c.dequeue(req(
                pb::DequeueRequest {
                    queues: vec![queue.into()],
                    worker_id: "w".into(),
                    ..Default::default()
                },
                token,
            ))
            .await,
        ),
        Rpc::Lease => code(
            c.lease(req(
                pb::LeaseRequest {
                    queues: vec![queue.into()],
                    worker_id: "w".into(),
                    capacity: 1,
                    ..Default::default()
                },
                token,
            ))
            .await,
        ),
        Rpc::Ack => {
            let (job_id, lease_id) = leased(c, queue, taker).await;
            code(
                c.ack(req(
                    pb::AckRequest {
                        result: Vec::new(),
                        job_id,
                        lease_id,
                    },
                    token,
                ))
                .await,
            )
        }
        Rpc::Fail => {
            let (job_id, lease_id) = leased(c, queue, taker).await;
            code(
                c.fail(req(
                    pb::FailRequest {
                        job_id,
                        lease_id,
                        error: "boom".into(),
                        ..Default::default()
                    },
                    token,
                ))
                .await,
            )
        }
        Rpc::Heartbeat => {
            let (job_id, lease_id) = leased(c, queue, taker).await;
            let lease = pb::LeaseRef {
                job_id,
                lease_id,
                progress: None,
            };
            let beat = pb::HeartbeatRequest {
                worker_id: "w".into(),
                leases: vec![lease.clone()],
                ..Default::default()
            };
            match c.heartbeat(req(beat, token)).await {
                // Reported lost: to the caller, a job that is not there.
                Ok(r) if r.get_ref().lost == [lease] => Code::NotFound,
                r => code(r),
            }
        }
        Rpc::Retry => {
            let (job_id, lease_id) = leased(c, queue, "root").await;
            let failed = c
                .fail(req(
                    pb::FailRequest {
                        job_id: job_id.clone(),
                        lease_id,
                        error: "dead".into(),
                        fatal: true,
                        ..Default::default()
                    },
                    Some("root"),
                ))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(failed.job.unwrap().status, pb::JobStatus::Failed as i32);
            code(c.retry(req(pb::RetryRequest { job_id }, token)).await)
        }
        Rpc::CancelJob => {
            let id = enqueue(c, queue, "root").await;
            let cancel = pb::CancelJobRequest {
                id,
                reason: "r".into(),
            };
            code(c.cancel_job(req(cancel, token)).await)
        }
        Rpc::PauseQueue => {
            let pause = pb::PauseQueueRequest {
                queue: queue.into(),
            };
            let got = code(c.pause_queue(req(pause, token)).await);
            // Leave the queue as it was for the next calls.
            let resume = pb::ResumeQueueRequest {
                queue: queue.into(),
            };
            c.resume_queue(req(resume, Some("root"))).await.unwrap();
            got
        }
        Rpc::ResumeQueue => {
            let resume = pb::ResumeQueueRequest {
                queue: queue.into(),
            };
            code(c.resume_queue(req(resume, token)).await)
        }
        Rpc::DeleteJob => {
            let id = enqueue(c, queue, "root").await;
            code(c.delete_job(req(pb::DeleteJobRequest { id }, token)).await)
        }
        Rpc::PurgeJobs => {
            let purge = pb::PurgeJobsRequest {
                queue: queue.into(),
                ..Default::default()
            };
            code(c.purge_jobs(req(purge, token)).await)
        }
        Rpc::CreateSchedule => code(c.create_schedule(req(yearly(queue), token)).await),
        Rpc::DeleteSchedule => {
            c.create_schedule(req(yearly(queue), Some("root")))
                .await
                .unwrap();
            let delete = pb::DeleteScheduleRequest {
                name: format!("s-{queue}"),
            };
            code(c.delete_schedule(req(delete, token)).await)
        }
        Rpc::GetJob => {
            let id = enqueue(c, queue, "root").await;
            code(c.get_job(req(pb::GetJobRequest { id }, token)).await)
        }
        Rpc::ListJobs => code(
            c.list_jobs(req(
                pb::ListJobsRequest {
                    queue: queue.into(),
                    ..Default::default()
                },
                token,
            ))
            .await,
        ),
        Rpc::Stats => code(
            c.stats(req(
                pb::StatsRequest {
                    queue: queue.into(),
                },
                token,
            ))
            .await,
        ),
    }
}

#[tokio::test]
async fn every_rpc_by_every_role_in_and_out_of_its_queues() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let mut n = 0;
    let mut failures = Vec::new();
    for rpc in RPCS {
        for &(token, role, _) in TOKENS
            .iter()
            .filter(|t| t.0 != "root" && t.0 != "consumer2")
        {
            for inside in [true, false] {
                n += 1;
                let queue = if inside {
                    format!("in.q{n}")
                } else {
                    format!("out.q{n}")
                };
                let has_role = role == "admin" || role == needs(rpc);
                let allowed = inside && has_role;
                // A job or schedule, named by id or name, of a queue the
                // token may not read is one that does not exist.
                let by_name = matches!(
                    rpc,
                    Rpc::GetJob
                        | Rpc::Retry
                        | Rpc::CancelJob
                        | Rpc::DeleteJob
                        | Rpc::Ack
                        | Rpc::Fail
                        | Rpc::Heartbeat
                        | Rpc::DeleteSchedule
                );
                let want = if allowed {
                    Code::Ok
                } else if has_role && by_name {
                    Code::NotFound
                } else {
                    Code::PermissionDenied
                };
                let got = call(&mut c, rpc, &queue, Some(token)).await;
                if got != want {
                    failures.push(format!(
                        "{rpc:?} as {token} on {queue}: {got:?}, want {want:?}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn no_token_or_an_unknown_one_is_unauthenticated_on_every_rpc() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    for rpc in RPCS {
        assert_eq!(
            call(&mut c, rpc, "in.anon", None).await,
            Code::Unauthenticated,
            "{rpc:?} without a token"
        );
        assert_eq!(
            call(&mut c, rpc, "in.anon", Some("nobody")).await,
            Code::Unauthenticated,
            "{rpc:?} with an unknown token"
        );
    }
    // A malformed header too.
    let mut r = Request::new(pb::StatsRequest::default());
    r.metadata_mut()
        .insert("authorization", "Basic dXNlcjpwdw==".parse().unwrap());
    assert_eq!(code(c.stats(r).await), Code::Unauthenticated);
}

#[tokio::test]
async fn health_and_reflection_stay_open() {
    let server = TestServer::start().await;
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "jobq.v1.JobQueue".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let mut reflection =
        tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(channel);
    let ask = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(vec![ask]))
        .await
        .unwrap()
        .into_inner();
    let first = answers.message().await.unwrap().expect("an answer");
    assert!(format!("{first:?}").contains("jobq.v1.JobQueue"));
}

#[tokio::test]
async fn a_lease_belongs_to_the_token_that_took_it() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let (job_id, lease_id) = leased(&mut c, "in.owned", "consumer").await;
    let lease = pb::LeaseRef {
        job_id: job_id.clone(),
        lease_id: lease_id.clone(),
        progress: None,
    };
    // Another token with the same role and queues knows the ids: still no.
    let other = Some("consumer2");
    let ack = pb::AckRequest {
        result: Vec::new(),
        job_id: job_id.clone(),
        lease_id: lease_id.clone(),
    };
    assert_eq!(
        code(c.ack(req(ack.clone(), other)).await),
        Code::PermissionDenied
    );
    let fail = pb::FailRequest {
        job_id: job_id.clone(),
        lease_id: lease_id.clone(),
        error: "x".into(),
        ..Default::default()
    };
    assert_eq!(code(c.fail(req(fail, other)).await), Code::PermissionDenied);
    let beat = pb::HeartbeatRequest {
        worker_id: "w".into(),
        leases: vec![lease.clone()],
        ..Default::default()
    };
    assert_eq!(
        code(c.heartbeat(req(beat.clone(), other)).await),
        Code::PermissionDenied
    );
    // Nor may it adopt the lease on a Lease stream of its own.
    let adopt = pb::LeaseRequest {
        queues: vec!["in.owned".into()],
        worker_id: "w".into(),
        capacity: 1,
        held: vec![lease.clone()],
        ..Default::default()
    };
    assert_eq!(
        code(c.lease(req(adopt, other)).await),
        Code::PermissionDenied
    );
    // The job is untouched, and its own token completes it.
    let job = c
        .get_job(req(pb::GetJobRequest { id: job_id.clone() }, Some("root")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(job.status, pb::JobStatus::Running as i32);
    let beat = c
        .heartbeat(req(beat, Some("consumer")))
        .await
        .unwrap()
        .into_inner();
    assert!(beat.lost.is_empty());
    let done = c
        .ack(req(ack, Some("consumer")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.job.unwrap().status, pb::JobStatus::Done as i32);
}

#[tokio::test]
async fn listing_without_a_queue_needs_every_queue_stats_show_only_the_tokens() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    enqueue(&mut c, "in.mine", "root").await;
    enqueue(&mut c, "out.theirs", "root").await;
    let all = c
        .list_jobs(req(pb::ListJobsRequest::default(), Some("root")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.jobs.len(), 2);
    // Across queues, a page token could name another queue's job (and
    // say it matched the filter): a token that reads only some queues
    // names one.
    let across = c
        .list_jobs(req(pb::ListJobsRequest::default(), Some("reader")))
        .await
        .unwrap_err();
    assert_eq!(across.code(), Code::PermissionDenied, "{across:?}");
    let mine = c
        .list_jobs(req(
            pb::ListJobsRequest {
                queue: "in.mine".into(),
                ..Default::default()
            },
            Some("reader"),
        ))
        .await
        .unwrap()
        .into_inner();
    let queues: Vec<_> = mine.jobs.iter().map(|j| j.queue.as_str()).collect();
    assert_eq!(queues, ["in.mine"]);
    let stats = c
        .stats(req(pb::StatsRequest::default(), Some("reader")))
        .await
        .unwrap()
        .into_inner();
    let queues: Vec<_> = stats.queues.iter().map(|q| q.queue.as_str()).collect();
    assert_eq!(queues, ["in.mine"]);
    for queue in ["in.mine", "out.theirs"] {
        c.create_schedule(req(yearly(queue), Some("root")))
            .await
            .unwrap();
    }
    let schedules = c
        .list_schedules(req(pb::ListSchedulesRequest {}, Some("reader")))
        .await
        .unwrap()
        .into_inner()
        .schedules;
    let queues: Vec<_> = schedules.iter().map(|s| s.queue.as_str()).collect();
    assert_eq!(queues, ["in.mine"]);
    assert_eq!(
        code(
            c.list_schedules(req(pb::ListSchedulesRequest {}, Some("producer")))
                .await
        ),
        Code::PermissionDenied
    );
    // A token without the read role on any queue is refused, not shown
    // an empty list.
    assert_eq!(
        code(
            c.stats(req(pb::StatsRequest::default(), Some("producer")))
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            c.list_jobs(req(pb::ListJobsRequest::default(), Some("producer")))
                .await
        ),
        Code::PermissionDenied
    );
}

/// A token with no read (or admin) role anywhere learns nothing about
/// which job ids exist: an id that names a job and one that does not get
/// the same PERMISSION_DENIED.
#[tokio::test]
async fn a_token_without_the_role_cannot_tell_a_real_job_id_from_a_missing_one() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let real = enqueue(&mut c, "in.ids", "producer").await;
    for id in [real, "424242".to_owned()] {
        let got = [
            code(
                c.get_job(req(pb::GetJobRequest { id: id.clone() }, Some("producer")))
                    .await,
            ),
            code(
                c.retry(req(
                    pb::RetryRequest { job_id: id.clone() },
                    Some("producer"),
                ))
                .await,
            ),
            code(
                c.cancel_job(req(
                    pb::CancelJobRequest {
                        id: id.clone(),
                        reason: String::new(),
                    },
                    Some("consumer"),
                ))
                .await,
            ),
            code(
                c.delete_job(req(pb::DeleteJobRequest { id: id.clone() }, Some("reader")))
                    .await,
            ),
        ];
        assert_eq!(got, [Code::PermissionDenied; 4], "job {id}");
    }
    // With the role on some queue, a missing id is NOT_FOUND.
    let missing = pb::GetJobRequest {
        id: "424242".into(),
    };
    assert_eq!(
        code(c.get_job(req(missing, Some("reader"))).await),
        Code::NotFound
    );
}

#[tokio::test]
async fn create_schedule_cannot_replace_a_schedule_on_a_queue_the_token_may_not_administer() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let theirs = pb::CreateScheduleRequest {
        name: "nightly".into(),
        ..yearly("out.billing")
    };
    c.create_schedule(req(theirs, Some("root"))).await.unwrap();
    // `admin` administers in.* only: taking the name over for one of its
    // own queues would silently delete out.billing's schedule.
    let hijack = pb::CreateScheduleRequest {
        name: "nightly".into(),
        ..yearly("in.mine")
    };
    assert_eq!(
        code(c.create_schedule(req(hijack, Some("admin"))).await),
        Code::PermissionDenied
    );
    let schedules = c
        .list_schedules(req(pb::ListSchedulesRequest {}, Some("root")))
        .await
        .unwrap()
        .into_inner()
        .schedules;
    let named: Vec<_> = schedules
        .iter()
        .map(|s| (s.name.as_str(), s.queue.as_str()))
        .collect();
    assert_eq!(named, [("nightly", "out.billing")]);
    // A new name on its own queue is still fine.
    c.create_schedule(req(yearly("in.mine"), Some("admin")))
        .await
        .unwrap();
}

/// The answer about a job in a queue the token may not use names the job,
/// never its queue: the caller may not learn where another tenant's job
/// is (nor, when it may not read the queue, that the job exists).
#[tokio::test]
async fn a_refusal_for_another_queues_job_does_not_name_the_queue() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let id = enqueue(&mut c, "out.secret-queue", "root").await;
    let refused = c
        .get_job(req(pb::GetJobRequest { id: id.clone() }, Some("reader")))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound);
    assert!(!refused.message().contains("secret"), "{refused:?}");
    assert!(refused.message().contains(&id), "{refused:?}");
    let (job, lease) = leased(&mut c, "out.secret-queue", "root").await;
    let refused = c
        .ack(req(
            pb::AckRequest {
                result: Vec::new(),
                job_id: job,
                lease_id: lease,
            },
            Some("consumer"),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound);
    assert!(!refused.message().contains("secret"), "{refused:?}");
}

/// The code and the message of a refusal, with `name` (the job id or
/// schedule name asked about) replaced, so that answers about two
/// different names compare equal when they say the same thing.
fn answer<T>(r: Result<T, tonic::Status>, name: &str) -> (Code, String) {
    match r {
        Ok(_) => (Code::Ok, String::new()),
        Err(s) => (s.code(), s.message().replace(name, "<name>")),
    }
}

async fn as_root(c: &mut Cli, id: &str) -> pb::Job {
    let get = pb::GetJobRequest { id: id.into() };
    c.get_job(req(get, Some("root")))
        .await
        .unwrap()
        .into_inner()
}

/// A token with a role on some queues asks about a job (or schedule) of a
/// queue it may not read, and about an id (or name) that names nothing:
/// both answers are the same NOT_FOUND, with the same message, which names
/// no queue; and nothing changes. Else it could count another tenant's
/// jobs, or learn its schedules' names, by asking.
#[tokio::test]
async fn a_job_or_schedule_of_a_queue_the_token_cannot_read_looks_missing() {
    let server = TestServer::start().await;
    let mut c = server.client().await;
    let hidden = "out.hidden";
    let (failed, failed_lease) = leased(&mut c, hidden, "root").await;
    c.fail(req(
        pb::FailRequest {
            job_id: failed.clone(),
            lease_id: failed_lease,
            error: "dead".into(),
            fatal: true,
            ..Default::default()
        },
        Some("root"),
    ))
    .await
    .unwrap();
    let (running, lease_id) = leased(&mut c, hidden, "root").await;
    // Last: a dequeue takes the oldest due job.
    let pending = enqueue(&mut c, hidden, "root").await;
    c.create_schedule(req(yearly(hidden), Some("root")))
        .await
        .unwrap();
    let missing = "424242".to_owned();
    let mut before = Vec::new();
    for id in [&pending, &failed, &running] {
        before.push(as_root(&mut c, id).await);
    }

    let mut differ = Vec::new();
    for (rpc, real) in [
        ("GetJob as reader", &pending),
        ("Retry as admin", &failed),
        ("CancelJob as admin", &pending),
        ("DeleteJob as admin", &pending),
        ("Ack as consumer", &running),
        ("Fail as consumer", &running),
        ("Heartbeat as consumer", &running),
        ("Lease adopting as consumer", &running),
    ] {
        let mut answers = Vec::new();
        for id in [real, &missing] {
            let lease = pb::LeaseRef {
                job_id: id.clone(),
                lease_id: lease_id.clone(),
                progress: None,
            };
            let got = match rpc {
                "GetJob as reader" => answer(
                    c.get_job(req(pb::GetJobRequest { id: id.clone() }, Some("reader")))
                        .await,
                    id,
                ),
                "Retry as admin" => answer(
                    c.retry(req(pb::RetryRequest { job_id: id.clone() }, Some("admin")))
                        .await,
                    id,
                ),
                "CancelJob as admin" => answer(
                    c.cancel_job(req(
                        pb::CancelJobRequest {
                            id: id.clone(),
                            reason: "mine now".into(),
                        },
                        Some("admin"),
                    ))
                    .await,
                    id,
                ),
                "DeleteJob as admin" => answer(
                    c.delete_job(req(pb::DeleteJobRequest { id: id.clone() }, Some("admin")))
                        .await,
                    id,
                ),
                "Ack as consumer" => answer(
                    c.ack(req(
                        pb::AckRequest {
                            result: Vec::new(),
                            job_id: id.clone(),
                            lease_id: lease_id.clone(),
                        },
                        Some("consumer"),
                    ))
                    .await,
                    id,
                ),
                "Fail as consumer" => answer(
                    c.fail(req(
                        pb::FailRequest {
                            job_id: id.clone(),
                            lease_id: lease_id.clone(),
                            error: "x".into(),
                            fatal: true,
                            ..Default::default()
                        },
                        Some("consumer"),
                    ))
                    .await,
                    id,
                ),
                // A heartbeat reports a lease of a job that does not exist
                // as lost: so must it one of a job the token cannot see.
                "Heartbeat as consumer" => {
                    let beat = pb::HeartbeatRequest {
                        worker_id: "w".into(),
                        leases: vec![lease.clone()],
                        ..Default::default()
                    };
                    match c.heartbeat(req(beat, Some("consumer"))).await {
                        Ok(r) => {
                            let lost = r.into_inner().lost == [lease.clone()];
                            (Code::Ok, format!("reported lost: {lost}"))
                        }
                        Err(s) => (s.code(), s.message().replace(id.as_str(), "<name>")),
                    }
                }
                // A Lease stream drops a declared lease of a job that does
                // not exist: so must it one of a job the token cannot see.
                _ => answer(
                    c.lease(req(
                        pb::LeaseRequest {
                            queues: vec!["in.adopt".into()],
                            worker_id: "w".into(),
                            capacity: 1,
                            held: vec![lease.clone()],
                            ..Default::default()
                        },
                        Some("consumer"),
                    ))
                    .await,
                    id,
                ),
            };
            answers.push(got);
        }
        let want = match rpc {
            "Heartbeat as consumer" => (Code::Ok, "reported lost: true".to_owned()),
            "Lease adopting as consumer" => (Code::Ok, String::new()),
            _ => (Code::NotFound, "job <name> not found".to_owned()),
        };
        if answers[0] != want || answers[1] != want {
            differ.push(format!(
                "{rpc}: real job {:?}, missing job {:?}, want {want:?} for both",
                answers[0], answers[1]
            ));
        }
    }

    let schedule = format!("s-{hidden}");
    let mut answers = Vec::new();
    for name in [schedule.as_str(), "s-none"] {
        let delete = pb::DeleteScheduleRequest { name: name.into() };
        answers.push(answer(
            c.delete_schedule(req(delete, Some("admin"))).await,
            name,
        ));
    }
    let want = (Code::NotFound, "schedule \"<name>\" not found".to_owned());
    if answers[0] != want || answers[1] != want {
        differ.push(format!(
            "DeleteSchedule as admin: real {:?}, missing {:?}, want {want:?} for both",
            answers[0], answers[1]
        ));
    }
    // A token that administers nothing is refused alike for both.
    let mut answers = Vec::new();
    for name in [schedule.as_str(), "s-none"] {
        let delete = pb::DeleteScheduleRequest { name: name.into() };
        answers.push(answer(
            c.delete_schedule(req(delete, Some("reader"))).await,
            name,
        ));
    }
    if answers[0] != answers[1] || answers[0].0 != Code::PermissionDenied {
        differ.push(format!(
            "DeleteSchedule as reader: real {:?}, missing {:?}, want one PERMISSION_DENIED",
            answers[0], answers[1]
        ));
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));

    // Nothing changed (the running job's lease was not extended either).
    let mut after = Vec::new();
    for id in [&pending, &failed, &running] {
        after.push(as_root(&mut c, id).await);
    }
    assert_eq!(before, after);
    let schedules = c
        .list_schedules(req(pb::ListSchedulesRequest {}, Some("root")))
        .await
        .unwrap()
        .into_inner()
        .schedules;
    assert!(
        schedules.iter().any(|s| s.name == schedule),
        "{schedules:?}"
    );
    // The lease is still root's: its ack goes through.
    let done = c
        .ack(req(
            pb::AckRequest {
                result: Vec::new(),
                job_id: running,
                lease_id,
            },
            Some("root"),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.job.unwrap().status, pb::JobStatus::Done as i32);
}
