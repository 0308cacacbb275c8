//! Schedules: a job enqueued on every tick of a cron expression.
//!
//! A [`Schedule`] is what the stores keep; a [`Timetable`] is its cron
//! expression compiled in its time zone. The rules of which tick to enqueue
//! live here, pure and clock-free, so the scheduler task
//! (`crate::scheduler`) only loads, asks, enqueues and waits:
//! - each tick enqueues one job keyed [`tick_key`], so a tick is enqueued
//!   at most once however many servers (sharing a store) or restarts see
//!   it: the key de-duplicates;
//! - after downtime only the latest missed tick is enqueued
//!   ([`due_tick`]);
//! - a schedule's first tick is its first at or after its creation.

use std::{
    str::FromStr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use croner::{
    parser::{CronParser, Seconds},
    Cron,
};
use serde::{Deserialize, Serialize};

/// Longest schedule name: its job keys (`schedule:<name>:<tick>`) must
/// stay within the key length limit.
pub const MAX_SCHEDULE_NAME_LEN: usize = 64;

/// A stored schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// Unique name; part of every job key it makes.
    pub name: String,
    /// The queue its jobs go to.
    pub queue: String,
    /// Their kind.
    pub kind: String,
    /// Their payload.
    pub payload: Vec<u8>,
    /// The cron expression (five fields, six with leading seconds, or seven
    /// with a trailing year).
    pub cron: String,
    /// The IANA time zone the expression is read in.
    pub timezone: String,
    /// Their attempt limit (already defaulted).
    pub max_attempts: u32,
    /// When it was created (or last replaced): no tick before this is
    /// enqueued.
    pub created_at: SystemTime,
    /// The latest tick enqueued, if any.
    #[serde(default)]
    pub last_tick: Option<SystemTime>,
}

/// A schedule's cron expression, compiled, in its time zone.
#[derive(Debug, Clone)]
pub struct Timetable {
    cron: Cron,
    tz: Tz,
}

/// A cron expression or time zone that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TimetableError(pub String);

impl Timetable {
    /// Compiles `cron` (five fields, six with a leading seconds field, or
    /// seven with a trailing year)
    /// in `timezone` (an IANA name; empty means UTC).
    ///
    /// # Errors
    /// A message naming what does not parse.
    pub fn parse(cron: &str, timezone: &str) -> Result<Timetable, TimetableError> {
        let tz = if timezone.is_empty() {
            Tz::UTC
        } else {
            Tz::from_str(timezone).map_err(|_| {
                TimetableError(format!(
                    "timezone {timezone:?} is not an IANA time zone name (e.g. Europe/Berlin, UTC)"
                ))
            })?
        };
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(cron)
            .map_err(|e| TimetableError(format!("cron {cron:?} does not parse: {e}")))?;
        Ok(Timetable { cron, tz })
    }

    /// The table of a stored schedule.
    ///
    /// # Errors
    /// As [`Timetable::parse`] (a stored schedule was checked when it was
    /// created, so only a newer jobq's expression fails here).
    pub fn of(schedule: &Schedule) -> Result<Timetable, TimetableError> {
        Timetable::parse(&schedule.cron, &schedule.timezone)
    }

    fn zoned(&self, t: SystemTime) -> DateTime<Tz> {
        DateTime::<Utc>::from(t).with_timezone(&self.tz)
    }

    /// The latest tick at or before `t`.
    pub fn latest_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        self.cron
            .find_previous_occurrence(&self.zoned(t), true)
            .ok()
            .map(|d| d.with_timezone(&Utc).into())
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        self.cron
            .find_next_occurrence(&self.zoned(t), false)
            .ok()
            .map(|d| d.with_timezone(&Utc).into())
    }
}

/// How far past now a recorded last tick may lie and still be trusted:
/// servers sharing a store disagree on the time by a little (a tick that
/// another server recorded may be seconds ahead of this one's clock),
/// while a clock that ran ahead and was set back is off by much more.
pub const CLOCK_AHEAD_MARGIN: Duration = Duration::from_secs(10 * 60);

/// The tick to enqueue at `now`, if any: the latest tick at or before
/// `now`, provided it is after the last one enqueued and not before the
/// schedule was created. Ticks missed in between (downtime) are skipped:
/// only the latest is enqueued. A last tick more than
/// [`CLOCK_AHEAD_MARGIN`] past `now` was recorded under a clock that ran
/// ahead (a bad RTC, a restored snapshot) and has since been set back: it
/// is not trusted, or the schedule would stay silent until the clock caught
/// up with it; the tick's key still keeps a tick from being enqueued twice.
pub fn due_tick(schedule: &Schedule, table: &Timetable, now: SystemTime) -> Option<SystemTime> {
    let tick = table.latest_at_or_before(now)?;
    let fresh = match schedule.last_tick {
        Some(last) if last <= now + CLOCK_AHEAD_MARGIN => tick > last,
        _ => tick >= schedule.created_at && schedule.created_at <= now + CLOCK_AHEAD_MARGIN,
    };
    fresh.then_some(tick)
}

/// For a schedule created under a clock that ran ahead (its `created_at`
/// more than [`CLOCK_AHEAD_MARGIN`] past `now`) and with no trusted
/// `last_tick`: the time to record as its last tick, without enqueueing
/// anything, so that it runs from its next tick on rather than stay silent
/// until the clock catches up with `created_at`. Ticks up to then may
/// predate the schedule (its real creation time is lost), so none of them
/// is enqueued. `None` for every other schedule.
pub fn untrusted_start(
    schedule: &Schedule,
    table: &Timetable,
    now: SystemTime,
) -> Option<SystemTime> {
    let trusted = |t: SystemTime| t <= now + CLOCK_AHEAD_MARGIN;
    if trusted(schedule.created_at) || schedule.last_tick.is_some_and(trusted) {
        return None;
    }
    Some(table.latest_at_or_before(now).unwrap_or(now))
}

/// The job key of one tick: `schedule:<name>:<tick in RFC 3339, UTC>`.
pub fn tick_key(name: &str, tick: SystemTime) -> String {
    let at = DateTime::<Utc>::from(tick).to_rfc3339_opts(SecondsFormat::AutoSi, true);
    format!("schedule:{name}:{at}")
}

/// `t` cut to whole microseconds (as the PostgreSQL store keeps times), so
/// a schedule reads back as it was written.
pub fn micros(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => UNIX_EPOCH + Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(0)),
        Err(_) => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> SystemTime {
        DateTime::parse_from_rfc3339(rfc3339).unwrap().into()
    }

    fn schedule(cron: &str, timezone: &str, created: &str) -> Schedule {
        Schedule {
            name: "nightly".into(),
            queue: "reports".into(),
            kind: "build-report".into(),
            payload: vec![],
            cron: cron.into(),
            timezone: timezone.into(),
            max_attempts: 3,
            created_at: at(created),
            last_tick: None,
        }
    }

    #[test]
    fn five_or_six_fields_and_iana_zones() {
        assert!(Timetable::parse("0 3 * * *", "").is_ok());
        assert!(Timetable::parse("*/1 * * * * *", "UTC").is_ok());
        assert!(Timetable::parse("0 0 3 * * MON-FRI", "Europe/Berlin").is_ok());
        for bad in ["", "* * *", "61 * * * *", "banana", "* * * * * * * *"] {
            assert!(Timetable::parse(bad, "").is_err(), "{bad:?}");
        }
        let err = Timetable::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert!(err.0.contains("IANA"), "{err}");
    }

    #[test]
    fn ticks_follow_the_time_zone() {
        // 03:00 in Berlin is 02:00 UTC in winter.
        let t = Timetable::parse("0 3 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            t.next_after(at("2026-12-03T10:00:00Z")),
            Some(at("2026-12-04T02:00:00Z"))
        );
        assert_eq!(
            t.latest_at_or_before(at("2026-12-03T10:00:00Z")),
            Some(at("2026-12-03T02:00:00Z"))
        );
    }

    #[test]
    fn only_the_latest_missed_tick_is_due_and_never_one_before_creation() {
        let s = schedule("*/10 * * * * *", "", "2026-12-03T10:00:05Z");
        let t = Timetable::of(&s).unwrap();
        assert_eq!(due_tick(&s, &t, at("2026-12-03T10:00:09Z")), None);
        assert_eq!(
            due_tick(&s, &t, at("2026-12-03T10:00:10Z")),
            Some(at("2026-12-03T10:00:10Z"))
        );
        let s = Schedule {
            last_tick: Some(at("2026-12-03T10:00:10Z")),
            ..s
        };
        assert_eq!(due_tick(&s, &t, at("2026-12-03T10:00:19Z")), None);
        // Down from 10:00:11 to 10:01:03: 10:00:20 … 10:01:00 were missed;
        // only 10:01:00 is enqueued.
        assert_eq!(
            due_tick(&s, &t, at("2026-12-03T10:01:03Z")),
            Some(at("2026-12-03T10:01:00Z"))
        );
    }

    #[test]
    fn a_last_tick_from_a_clock_that_ran_ahead_does_not_silence_the_schedule() {
        let s = Schedule {
            last_tick: Some(at("2026-12-09T10:00:00Z")),
            ..schedule("0 * * * * *", "", "2026-12-03T09:00:00Z")
        };
        let t = Timetable::of(&s).unwrap();
        assert_eq!(
            due_tick(&s, &t, at("2026-12-03T10:00:30Z")),
            Some(at("2026-12-03T10:00:00Z"))
        );
    }

    #[test]
    fn a_schedule_created_under_a_clock_that_ran_ahead_runs_from_its_next_tick() {
        // Created a day ahead; the clock was then set back.
        let mut s = schedule("*/10 * * * *", "UTC", "2026-12-06T10:00:00Z");
        let t = Timetable::of(&s).unwrap();
        let now = at("2026-12-05T10:05:00Z");
        assert_eq!(
            due_tick(&s, &t, now),
            None,
            "ticks before it may predate it"
        );
        let start = untrusted_start(&s, &t, now).expect("an untrusted creation time");
        assert_eq!(start, at("2026-12-05T10:00:00Z"));
        // Recorded as its last tick, it runs from the next one on.
        s.last_tick = Some(start);
        assert_eq!(untrusted_start(&s, &t, now), None);
        assert_eq!(
            due_tick(&s, &t, at("2026-12-05T10:10:30Z")),
            Some(at("2026-12-05T10:10:00Z"))
        );
        // A last tick from the same clock is not trusted either.
        s.last_tick = Some(at("2026-12-06T10:10:00Z"));
        assert!(untrusted_start(&s, &t, now).is_some());
        // Within the margin, creation times are trusted as before.
        let s = schedule("*/10 * * * *", "UTC", "2026-12-05T10:06:00Z");
        assert_eq!(untrusted_start(&s, &t, now), None);
    }

    #[test]
    fn a_last_tick_a_little_ahead_is_another_servers_and_trusted() {
        let s = Schedule {
            last_tick: Some(at("2026-12-03T10:01:00Z")),
            ..schedule("0 * * * * *", "", "2026-12-03T09:00:00Z")
        };
        let t = Timetable::of(&s).unwrap();
        // This server's clock is 2 s behind the one that recorded 10:01.
        assert_eq!(due_tick(&s, &t, at("2026-12-03T10:00:58Z")), None);
    }

    #[test]
    fn keys_name_the_schedule_and_the_tick() {
        assert_eq!(
            tick_key("nightly", at("2026-12-03T02:00:00Z")),
            "schedule:nightly:2026-12-03T02:00:00Z"
        );
    }
}
