//! End-to-end tests: real `jobq serve` processes (killed with SIGKILL where
//! the test is about crashes), in-process servers on 127.0.0.1:0, real
//! clients and workers. They wait on conditions, never on fixed sleeps.

mod bench;
mod chaos;
mod cli;
mod clocks;
mod cluster;
mod connections;
mod dashboard;
mod dashboard_sessions;
mod faults;
mod harness;
mod http_listener;
mod lease;
mod limits;
mod observability;
mod operator;
mod pki;
mod schedules;
mod secrets;
mod security;
mod server;
mod shaping;
mod token_in_clear;
mod traces;
mod worker;
mod worker_kinds;
mod worker_results;
mod worker_signals;
