//! An enqueue that meets the job holding its key (docs/src/shaping.md,
//! "Uniqueness"): that job is returned as it is, replaced, or loses its
//! key to the enqueue's new job, as [`rules::key_conflict`] says. Its new
//! record goes into the enqueue's write, so the change and the new job are
//! durable together or not at all.

use std::time::SystemTime;

use super::{encode, record::Payload, record_key, Sled};
use crate::{
    error::Result,
    job::{JobId, NewJob},
    machine::{self, Event},
    store::{rules, Change, Enqueued},
};

/// What meeting the holder left to do.
pub(super) enum Met {
    /// Nothing more: the enqueue's result is the holder, kept or replaced.
    Done(Box<Enqueued>),
    /// The holder lost its key: the enqueue creates its job, which takes
    /// the key over.
    TakenOver(Box<Change>),
}

/// What is done once the enqueue's records are written: payloads that a
/// replace left behind.
#[derive(Default)]
pub(super) struct Leftovers {
    /// Payloads in the `payloads` tree that a replaced job keeps inline now.
    payloads: Vec<JobId>,
    /// Payload files of replaced jobs.
    files: Vec<JobId>,
}

// A replaced job's new payload goes into its record, whatever its size:
// nothing the old record points to is touched before the new record is
// written, so a crash or an error before then leaves the job as it was.
// Its next change (its take) moves a big payload apart, as it does any
// record's. The old payload's place is cleared after the write (a file
// once the write is durable); one that a crash leaves behind is removed
// with the job (the tree's), or by the next start (a file its record no
// longer names).

impl Sled {
    /// Meets the job `holder` that has `new`'s key, adding its new record
    /// (if it changes) to `writes`.
    pub(super) fn meet_holder(
        &self,
        holder: JobId,
        new: &NewJob,
        now: SystemTime,
        writes: &mut Vec<([u8; 8], Option<Vec<u8>>)>,
        leftovers: &mut Leftovers,
    ) -> Result<Met> {
        let (old, loaded) = self.load_indexed(holder)?;
        let conflict = rules::key_conflict(&new.unique, &old, now);
        let Some(event) = conflict.event(&new.payload, &new.metadata, new.delay) else {
            return Ok(Met::Done(Box::new(Enqueued::existing(old))));
        };
        let replace = matches!(event, Event::Replace { .. });
        let mut changed = machine::apply(old.clone(), event, now)?;
        let placed = if replace {
            match loaded {
                Payload::Inline => {}
                Payload::Apart(_) => leftovers.payloads.push(holder),
                Payload::File(_) => leftovers.files.push(holder),
            }
            Payload::Inline
        } else {
            // The key alone changes: the payload stays where it is (an
            // older record's big inline payload stays too, until a change
            // of its status moves it).
            loaded
        };
        writes.push((record_key(holder), Some(encode(&mut changed, placed)?)));
        let change = Change { old, new: changed };
        Ok(match replace {
            true => Met::Done(Box::new(Enqueued {
                job: change.new.clone(),
                created: false,
                replaced: true,
                changed: Some(change),
            })),
            false => Met::TakenOver(Box::new(change)),
        })
    }

    /// Clears what replaced jobs left behind, once their records are
    /// written (a file once they are durable).
    pub(super) fn clear_leftovers(&self, leftovers: Leftovers) -> Result<()> {
        self.remove_payloads(leftovers.payloads)?;
        self.remove_files_when_durable(leftovers.files);
        Ok(())
    }
}
