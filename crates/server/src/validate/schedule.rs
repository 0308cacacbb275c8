//! Validation of the schedule RPCs (CreateSchedule, DeleteSchedule): same
//! rules as the rest of [`super`], plus the cron expression and time zone,
//! which are compiled here so a bad one is INVALID_ARGUMENT and stores
//! nothing.

use std::time::SystemTime;

use jobq::pb;

use super::{invalid, name};
use crate::{
    config::Config,
    error::{Error, Result},
    schedule::{micros, Schedule, Timetable, MAX_SCHEDULE_NAME_LEN},
};

/// Longest cron expression.
pub const MAX_CRON_LEN: usize = 256;

/// Longest time zone name.
pub const MAX_TIMEZONE_LEN: usize = 64;

/// A schedule's name: the name rules, at most [`MAX_SCHEDULE_NAME_LEN`]
/// characters (its job keys must fit the key limit).
pub fn schedule_name(value: &str) -> Result<()> {
    name("name", value)?;
    if value.len() > MAX_SCHEDULE_NAME_LEN {
        return Err(invalid(format!(
            "name is {} characters long; the limit for a schedule is {MAX_SCHEDULE_NAME_LEN}",
            value.len()
        )));
    }
    Ok(())
}

/// A CreateSchedule as the schedule to store (created at `now`), and its
/// compiled timetable.
pub fn create_schedule(
    req: pb::CreateScheduleRequest,
    config: &Config,
    now: SystemTime,
) -> Result<(Schedule, Timetable)> {
    schedule_name(&req.name)?;
    name("queue", &req.queue)?;
    name("kind", &req.kind)?;
    if req.payload.len() > config.max_payload {
        return Err(invalid(format!(
            "payload is {} bytes; the limit is {} (--max-payload)",
            req.payload.len(),
            config.max_payload
        )));
    }
    if req.cron.len() > MAX_CRON_LEN {
        return Err(invalid(format!(
            "cron is {} characters long; the limit is {MAX_CRON_LEN}",
            req.cron.len()
        )));
    }
    if req.timezone.len() > MAX_TIMEZONE_LEN {
        return Err(invalid(format!(
            "timezone is {} characters long; the limit is {MAX_TIMEZONE_LEN}",
            req.timezone.len()
        )));
    }
    let max_attempts = match req.max_attempts {
        0 => config.default_max_attempts.max(1),
        n if n > config.max_attempts_limit => {
            return Err(invalid(format!(
                "max_attempts {n} is over the limit of {}",
                config.max_attempts_limit
            )))
        }
        n => n,
    };
    let table = Timetable::parse(&req.cron, &req.timezone).map_err(|e| invalid(e.0))?;
    // An expression that matches no date to come (February 30th, a year
    // gone by) would never enqueue anything, and every look for its next
    // tick searches the cron library's whole range of years (10–20 ms,
    // each scheduler pass and each ListSchedules): refused here, once.
    if table.next_after(now).is_none() {
        return Err(invalid(format!(
            "cron {:?} has no tick after now: it would never fire",
            req.cron
        )));
    }
    let timezone = if req.timezone.is_empty() {
        "UTC".to_owned()
    } else {
        req.timezone
    };
    let schedule = Schedule {
        name: req.name,
        queue: req.queue,
        kind: req.kind,
        payload: req.payload,
        cron: req.cron.trim().to_owned(),
        timezone,
        max_attempts,
        created_at: micros(now),
        last_tick: None,
    };
    Ok((schedule, table))
}

/// Whether one more schedule named `name` fits `--max-schedules`, given
/// the `existing` ones (replacing one by name always fits).
pub fn schedule_room(existing: &[Schedule], new: &Schedule, config: &Config) -> Result<()> {
    let name = &new.name;
    if existing.len() >= config.max_schedules && !existing.iter().any(|s| s.name == *name) {
        return Err(Error::ResourceExhausted(format!(
            "there are {} schedules; the limit is {} (--max-schedules)",
            existing.len(),
            config.max_schedules
        )));
    }
    // ListSchedules answers with every schedule in one reply, and the
    // scheduler reads them all every second: together they stay within one
    // page (a reply over --max-message-bytes could not be sent at all).
    let total: usize = existing
        .iter()
        .filter(|s| s.name != *name)
        .chain(std::iter::once(new))
        .map(listed_bytes)
        .sum();
    if total > config.max_page_bytes {
        return Err(Error::ResourceExhausted(format!(
            "the schedules would take {total} bytes with this one; ListSchedules answers \
             in one page of at most {} bytes (--max-page-bytes)",
            config.max_page_bytes
        )));
    }
    Ok(())
}

/// About what a schedule takes in a ListSchedules reply: its strings and
/// payload, plus room for its numbers, times and field tags.
fn listed_bytes(s: &Schedule) -> usize {
    s.name.len()
        + s.queue.len()
        + s.kind.len()
        + s.payload.len()
        + s.cron.len()
        + s.timezone.len()
        + 64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> pb::CreateScheduleRequest {
        pb::CreateScheduleRequest {
            name: "nightly-report".into(),
            queue: "reports".into(),
            kind: "build-report".into(),
            cron: "0 3 * * *".into(),
            ..Default::default()
        }
    }

    #[test]
    fn schedules_together_stay_within_one_list_page() {
        let mut c = Config::with_data("unused");
        c.max_page_bytes = 10_000;
        let now = SystemTime::now();
        let with = |name: &str, bytes: usize| {
            let mut r = req();
            r.name = name.into();
            r.payload = vec![b'x'; bytes];
            create_schedule(r, &c, now).expect("valid").0
        };
        let existing = vec![with("a", 4_000), with("b", 4_000)];
        let err = schedule_room(&existing, &with("c", 4_000), &c).expect_err("over a page");
        assert!(matches!(err, Error::ResourceExhausted(_)), "{err}");
        assert!(err.to_string().contains("--max-page-bytes"), "{err}");
        // Replacing one counts its new size, not both.
        schedule_room(&existing, &with("b", 5_000), &c).expect("a replacement fits");
        schedule_room(&existing, &with("c", 1_000), &c).expect("a small one fits");
    }

    #[test]
    fn a_schedule_is_checked_whole() {
        let c = Config::with_data("unused");
        let now = SystemTime::now();
        let (s, _) = create_schedule(req(), &c, now).expect("valid");
        assert_eq!((s.timezone.as_str(), s.max_attempts), ("UTC", 3));
        // Rare is not never: every leap day.
        let leap = pb::CreateScheduleRequest {
            cron: "0 0 29 2 *".into(),
            ..req()
        };
        create_schedule(leap, &c, now).expect("a leap-day schedule");
        let bad = [
            pb::CreateScheduleRequest {
                name: "".into(),
                ..req()
            },
            pb::CreateScheduleRequest {
                name: "x".repeat(65),
                ..req()
            },
            pb::CreateScheduleRequest {
                name: "a b".into(),
                ..req()
            },
            pb::CreateScheduleRequest {
                queue: "".into(),
                ..req()
            },
            pb::CreateScheduleRequest {
                cron: "".into(),
                ..req()
            },
            pb::CreateScheduleRequest {
                cron: "0 25 * * *".into(),
                ..req()
            },
            // Parses, but never fires: February 30th, April 31st, a year
            // gone by.
            pb::CreateScheduleRequest {
                cron: "0 0 30 2 *".into(),
                ..req()
            },
            pb::CreateScheduleRequest {
                cron: "0 0 31 4 *".into(),
                ..req()
            },
            pb::CreateScheduleRequest {
                cron: "0 0 0 1 1 * 2020".into(),
                ..req()
            },
            pb::CreateScheduleRequest {
                timezone: "Nowhere/City".into(),
                ..req()
            },
            pb::CreateScheduleRequest {
                max_attempts: 1001,
                ..req()
            },
            pb::CreateScheduleRequest {
                payload: vec![0; c.max_payload + 1],
                ..req()
            },
        ];
        for b in bad {
            let err = create_schedule(b.clone(), &c, now).expect_err(&format!("{b:?}"));
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{b:?}");
        }
    }
}
