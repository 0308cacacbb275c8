//! Big payloads, each in a file of its own: `<data>/payloads/<job id>`.
//!
//! Why not sled: sled 0.34 keeps every value it writes in its page cache
//! until the page is read or evicted, and weighs a page by its size in the
//! log, where a value over ~128 KiB is a blob pointer of a few bytes. So
//! 1 GiB of 1 MB payloads held ~1 GiB of RSS while it was written, whatever
//! `--cache-bytes` said. A file's bytes sit in the kernel's page cache,
//! which is not the server's memory and is given back under pressure.
//!
//! Order, so that a record never refers to a payload the disk may not have:
//! - a file is written and made durable (its data, then the folder) before
//!   the record that refers to it is written;
//! - a file is removed only once the removal of its record is durable.
//!
//! A crash in between leaves a file no record refers to (an orphan), never
//! a record without its file. [`PayloadFiles::collect`] removes orphans at
//! startup: a file is named by its job's id, and the indexes know every id.

use std::{
    fs::File,
    io::{ErrorKind, Write},
    path::{Path, PathBuf},
};

use super::SledError;
use crate::{error::Result, job::JobId};

/// The folder, inside the data folder.
const FOLDER: &str = "payloads";

/// Most payload files one write holds open (an EnqueueBatch may carry a
/// thousand payloads; file descriptors are shared with connections).
const OPEN_AT_ONCE: usize = 64;

/// Where big payloads go. Cheap to clone (a path and a size), so a
/// blocking task can take one.
#[derive(Debug, Clone)]
pub(crate) struct PayloadFiles {
    dir: PathBuf,
    min: usize,
}

/// What a failed file operation means. A failed fsync is the disk
/// failing: [`SledError`], a storage error, which stops the store
/// (fail-stop). A full disk is `RESOURCE_EXHAUSTED`; anything else
/// (too many open files, a permission) is an internal error of this call
/// only: no record depends on a file that could not be written, and a
/// read changes nothing.
fn failed(path: &Path, action: &'static str, source: std::io::Error) -> crate::Error {
    if action == "fsync" {
        return SledError::PayloadFile {
            path: path.to_path_buf(),
            action,
            source,
        }
        .into();
    }
    let what = format!("cannot {action} payload file {}: {source}", path.display());
    match source.kind() {
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => {
            crate::Error::ResourceExhausted(format!("the disk is full ({what})"))
        }
        _ => crate::Error::Io(what),
    }
}

impl PayloadFiles {
    /// The payload files of the store in `data`; payloads of `min` bytes
    /// or more go to files. Creates the folder (durably) if it is missing.
    pub(crate) fn open(data: &Path, min: usize) -> Result<PayloadFiles> {
        let dir = data.join(FOLDER);
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).map_err(|e| failed(&dir, "create", e))?;
            File::open(data)
                .and_then(|d| d.sync_all())
                .map_err(|e| failed(data, "fsync", e))?;
        }
        Ok(PayloadFiles {
            dir,
            min: min.max(1),
        })
    }

    /// Whether a payload of `len` bytes goes to a file.
    pub(crate) fn wants(&self, len: usize) -> bool {
        len >= self.min
    }

    fn path(&self, id: JobId) -> PathBuf {
        self.dir.join(id.0.to_string())
    }

    /// Writes each payload to its job's file and makes them all durable:
    /// the files written first, then each one's data synced (the first
    /// sync commits what the others need too, so a batch costs little more
    /// than one file), [`OPEN_AT_ONCE`] at a time; then the folder once.
    /// Blocking. On an error some files may exist; no record refers to
    /// them.
    pub(crate) fn write<'a>(
        &self,
        payloads: impl IntoIterator<Item = (JobId, &'a [u8])>,
    ) -> Result<()> {
        let payloads: Vec<_> = payloads.into_iter().collect();
        for chunk in payloads.chunks(OPEN_AT_ONCE) {
            let mut written = Vec::with_capacity(chunk.len());
            for &(id, bytes) in chunk {
                let path = self.path(id);
                // A new file: ids are never issued twice, and if one were,
                // no live payload may be overwritten.
                let mut file = File::options()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(|e| failed(&path, "create", e))?;
                file.write_all(bytes)
                    .map_err(|e| failed(&path, "write", e))?;
                written.push((path, file));
            }
            for (path, file) in &written {
                file.sync_data().map_err(|e| failed(path, "fsync", e))?;
            }
        }
        if !payloads.is_empty() {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| failed(&self.dir, "fsync", e))?;
        }
        Ok(())
    }

    /// Opens a job's payload file, if it exists. Its bytes stay readable
    /// through the handle even if the file is removed meanwhile.
    pub(crate) fn open_file(&self, id: JobId) -> Result<Option<File>> {
        let path = self.path(id);
        match File::open(&path) {
            Ok(file) => Ok(Some(file)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(failed(&path, "open", e)),
        }
    }

    /// Reads all of job `id`'s payload file, opened by
    /// [`PayloadFiles::open_file`].
    pub(crate) fn read(&self, id: JobId, mut file: File) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes)
            .map_err(|e| failed(&self.path(id), "read", e))?;
        Ok(bytes)
    }

    /// Removes the files of jobs whose records are gone (durably). A file
    /// that cannot be removed is only logged: it is an orphan, which the
    /// next start removes.
    pub(crate) fn remove(&self, ids: impl IntoIterator<Item = JobId>) {
        for id in ids {
            let path = self.path(id);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a payload file");
                }
            }
        }
    }

    /// Removes every file named by a job id that `exists` says is gone:
    /// the orphans of an enqueue cut short (a crash, or a failed insert
    /// after its file was written) or of a removal not done (a crash after
    /// the record's removal was durable). Anything else in the folder is
    /// left alone. Run at startup, before any write. Returns how many it
    /// removed; one it cannot remove is logged.
    pub(crate) fn collect(&self, exists: impl Fn(JobId) -> bool) -> Result<u64> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| failed(&self.dir, "list", e))?;
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| failed(&self.dir, "list", e))?;
            let orphan = entry.file_type().is_ok_and(|t| t.is_file())
                && entry
                    .file_name()
                    .to_str()
                    .and_then(|name| name.parse::<u64>().ok())
                    .is_some_and(|id| !exists(JobId(id)));
            if orphan {
                let path = entry.path();
                match std::fs::remove_file(&path) {
                    Ok(()) => removed += 1,
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "cannot remove an orphan payload file");
                    }
                }
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::PayloadFiles;
    use crate::job::JobId;

    #[test]
    fn files_round_trip_and_orphans_are_collected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = PayloadFiles::open(dir.path(), 4).expect("open");
        assert!(!files.wants(3));
        assert!(files.wants(4));
        files
            .write([(JobId(1), &b"one!"[..]), (JobId(2), &b"two!!"[..])])
            .expect("write");
        let read = |id| {
            let file = files.open_file(id).unwrap();
            file.map(|f| files.read(id, f).unwrap())
        };
        assert_eq!(read(JobId(1)).as_deref(), Some(&b"one!"[..]));
        assert_eq!(read(JobId(3)), None);
        let stray = dir.path().join("payloads").join("stray");
        std::fs::write(&stray, b"x").unwrap();
        std::fs::create_dir(dir.path().join("payloads").join("7")).unwrap();
        assert_eq!(files.collect(|id| id == JobId(2)).expect("collect"), 1);
        assert_eq!(read(JobId(1)), None, "an orphan goes");
        assert!(stray.exists(), "what is not a payload file stays");
        assert!(
            files.write([(JobId(2), &b"again"[..])]).is_err(),
            "never overwritten"
        );
        assert_eq!(read(JobId(2)).as_deref(), Some(&b"two!!"[..]));
        files.remove([JobId(2), JobId(9)]);
        assert_eq!(read(JobId(2)), None);
        let again = PayloadFiles::open(dir.path(), 4).expect("reopen");
        assert_eq!(again.collect(|_| true).expect("collect"), 0);
    }
}
