//! [`PackedSet`]: a sorted set that stays packed when it grows at its end.
//!
//! A queue's PENDING jobs arrive mostly in order (`run_at` is the enqueue
//! time, ids rise) and leave mostly from the front. A `BTreeSet` grown
//! that way splits each full leaf in the middle and never fills it again:
//! 1M entries of 16 bytes took 35 MiB grown, 19 MiB built from sorted
//! input. Here entries live in sorted chunks of up to [`CHUNK`], keyed by
//! a lower bound; an entry past the end of a full last chunk starts a new
//! one, so a set grown in order is as packed as one built at once (~17
//! bytes per entry), also ahead of a later entry (a delayed job): a full
//! chunk splits where the new entry goes when that is in its back half,
//! in the middle otherwise. A nearly empty chunk joins a neighbour when
//! both fit in one.

use std::{
    collections::BTreeMap,
    ops::Bound::{Excluded, Unbounded},
};

use serde::{ser::SerializeSeq, Serialize, Serializer};

/// Most entries in one chunk: a binary search and a shift over at most
/// this many entries per insert or remove.
const CHUNK: usize = 64;

/// A sorted set of `T` (module docs).
#[derive(Debug, Clone)]
pub(crate) struct PackedSet<T: Ord> {
    /// Non-empty sorted chunks by a separator key: no entry of a chunk is
    /// below its key, and every entry is below the next chunk's key. A key
    /// starts as the chunk's first entry and stays when that entry leaves,
    /// so taking from the front does not re-key a chunk.
    chunks: BTreeMap<T, Vec<T>>,
}

impl<T: Ord> Default for PackedSet<T> {
    fn default() -> Self {
        PackedSet {
            chunks: BTreeMap::new(),
        }
    }
}

impl<T: Ord + Copy> PackedSet<T> {
    /// The least entry.
    pub(crate) fn first(&self) -> Option<&T> {
        self.chunks
            .first_key_value()
            .and_then(|(_, chunk)| chunk.first())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The entries in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.values().flatten()
    }

    /// The key of the chunk where `entry` is or would go: the last chunk
    /// whose key is not above it.
    fn chunk_of(&self, entry: &T) -> Option<T> {
        self.chunks
            .range(..=*entry)
            .next_back()
            .map(|(key, _)| *key)
    }

    /// Adds `entry`; false if it was there already.
    pub(crate) fn insert(&mut self, entry: T) -> bool {
        let Some(key) = self.chunk_of(&entry) else {
            // Below every key: at the front of the first chunk (re-keyed),
            // or a chunk of its own if that one is full.
            let mut chunk = match self.chunks.first_entry() {
                Some(first) if first.get().len() < CHUNK => first.remove(),
                _ => Vec::with_capacity(CHUNK),
            };
            chunk.insert(0, entry);
            self.chunks.insert(entry, chunk);
            return true;
        };
        let Some(chunk) = self.chunks.get_mut(&key) else {
            unreachable!("chunk_of returns a key of the map")
        };
        let at = match chunk.binary_search(&entry) {
            Ok(_) => return false,
            Err(at) => at,
        };
        if chunk.len() < CHUNK {
            chunk.insert(at, entry);
        } else if at == CHUNK {
            // Past the end of a full chunk (the usual append): a new one.
            let mut next = Vec::with_capacity(CHUNK);
            next.push(entry);
            self.chunks.insert(entry, next);
        } else if at > CHUNK / 2 {
            // In the back half, as when jobs arrive in order ahead of a
            // delayed one: split where the entry goes, so the front chunk
            // ends full instead of half full for good.
            let right = chunk.split_off(at);
            chunk.push(entry);
            self.chunks.insert(right[0], right);
        } else {
            let mut right = chunk.split_off(CHUNK / 2);
            right.reserve_exact(CHUNK - right.len());
            chunk.insert(at, entry);
            self.chunks.insert(right[0], right);
        }
        true
    }

    /// Removes `entry`; false if it was not there.
    pub(crate) fn remove(&mut self, entry: &T) -> bool {
        let Some(key) = self.chunk_of(entry) else {
            return false;
        };
        let Some(chunk) = self.chunks.get_mut(&key) else {
            unreachable!("chunk_of returns a key of the map")
        };
        let Ok(at) = chunk.binary_search(entry) else {
            return false;
        };
        chunk.remove(at);
        let len = chunk.len();
        if len == 0 {
            self.chunks.remove(&key);
        } else if len <= CHUNK / 4 {
            self.merge_small(key, len);
        }
        true
    }

    /// A chunk (`key`) left with `len` entries, a quarter or less: joins
    /// its successor or its predecessor if the two fit in one, so that
    /// removals in the middle cannot leave a chunk (and its allocation)
    /// per entry. Otherwise both neighbours are over three quarters full.
    fn merge_small(&mut self, key: T, len: usize) {
        let fits = |other: &Vec<T>| len + other.len() <= CHUNK;
        let next = self
            .chunks
            .range((Excluded(key), Unbounded))
            .next()
            .filter(|(_, next)| fits(next))
            .map(|(next_key, _)| *next_key);
        if let Some(next) = next.and_then(|next| self.chunks.remove(&next)) {
            if let Some(chunk) = self.chunks.get_mut(&key) {
                chunk.extend(next);
            }
            return;
        }
        let before = self
            .chunks
            .range(..key)
            .next_back()
            .filter(|(_, before)| fits(before))
            .map(|(before_key, _)| *before_key);
        if let Some(before) = before {
            // Its entries are below this chunk's key, so they stay in
            // order; its key stays the lower bound of the joined chunk.
            if let Some(chunk) = self.chunks.remove(&key) {
                if let Some(before) = self.chunks.get_mut(&before) {
                    before.extend(chunk);
                }
            }
        }
    }

    /// Moves every entry of `other` into this set.
    pub(crate) fn append(&mut self, other: &mut PackedSet<T>) {
        let mut merged: Vec<T> = Vec::with_capacity(self.len() + other.len());
        let (mut mine, mut theirs) = (
            std::mem::take(self).into_sorted().peekable(),
            std::mem::take(other).into_sorted().peekable(),
        );
        loop {
            let next = match (mine.peek(), theirs.peek()) {
                (Some(a), Some(b)) if a < b => mine.next(),
                (Some(a), Some(b)) if a == b => {
                    theirs.next();
                    mine.next()
                }
                (Some(_), Some(_)) | (None, Some(_)) => theirs.next(),
                (Some(_), None) => mine.next(),
                (None, None) => break,
            };
            merged.extend(next);
        }
        *self = merged.into_iter().collect();
    }

    /// Rebuilds the chunks full (after many inserts out of order).
    pub(crate) fn repack(&mut self) {
        *self = std::mem::take(self).into_sorted().collect();
    }

    fn len(&self) -> usize {
        self.chunks.values().map(Vec::len).sum()
    }

    fn into_sorted(self) -> impl Iterator<Item = T> {
        self.chunks.into_values().flatten()
    }
}

impl<T: Ord + Copy> PartialEq for PackedSet<T> {
    /// The same entries, however they are chunked.
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl<T: Ord + Copy> Eq for PackedSet<T> {}

impl<T: Ord + Copy> FromIterator<T> for PackedSet<T> {
    /// Full chunks from sorted input; other input is inserted one by one.
    fn from_iter<I: IntoIterator<Item = T>>(entries: I) -> Self {
        let mut set = PackedSet::default();
        let mut chunk: Vec<T> = Vec::with_capacity(CHUNK);
        let (mut unsorted, mut last) = (Vec::new(), None);
        for entry in entries {
            if last.is_some_and(|last| last >= entry) {
                unsorted.push(entry);
                continue;
            }
            if chunk.len() == CHUNK {
                let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                set.chunks.insert(full[0], full);
            }
            chunk.push(entry);
            last = Some(entry);
        }
        if let Some(&first) = chunk.first() {
            set.chunks.insert(first, chunk);
        }
        for entry in unsorted {
            set.insert(entry);
        }
        set
    }
}

impl<T: Ord + Copy + Serialize> Serialize for PackedSet<T> {
    /// As a sequence of the entries in order, like a `BTreeSet`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // With its length first, which postcard needs.
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for entry in self.iter() {
            seq.serialize_element(entry)?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16),
        Remove(u16),
        PopFirst,
    }

    /// Few enough values that inserts and removes often meet.
    const VALUES: std::ops::Range<u16> = 0..512;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => VALUES.prop_map(Op::Insert),
            2 => VALUES.prop_map(Op::Remove),
            1 => Just(Op::PopFirst),
        ]
    }

    /// Every chunk non-empty, sorted, within bounds, at or above its key,
    /// and below the next chunk's key.
    fn check(set: &PackedSet<u16>) {
        let mut last: Option<u16> = None;
        for (key, chunk) in &set.chunks {
            assert!(!chunk.is_empty() && chunk.len() <= CHUNK, "{chunk:?}");
            assert!(last.is_none_or(|last| last < *key), "below the key before");
            assert!(*key <= chunk[0]);
            for &entry in chunk {
                assert!(last.is_none_or(|last| last < entry), "not sorted");
                last = Some(entry);
            }
        }
    }

    proptest! {
        #[test]
        fn behaves_like_a_btreeset(
            start in proptest::collection::vec(VALUES, 0..300),
            ops in proptest::collection::vec(op(), 0..600),
        ) {
            let mut model: BTreeSet<u16> = start.iter().copied().collect();
            let mut set: PackedSet<u16> = start.into_iter().collect();
            check(&set);
            for op in ops {
                match op {
                    Op::Insert(v) => prop_assert_eq!(set.insert(v), model.insert(v)),
                    Op::Remove(v) => prop_assert_eq!(set.remove(&v), model.remove(&v)),
                    Op::PopFirst => {
                        let first = set.first().copied();
                        prop_assert_eq!(first, model.first().copied());
                        if let Some(first) = first {
                            prop_assert!(set.remove(&first));
                            model.remove(&first);
                        }
                    }
                }
                check(&set);
                prop_assert_eq!(set.is_empty(), model.is_empty());
            }
            prop_assert!(set.iter().copied().eq(model.iter().copied()));
        }

        #[test]
        fn append_is_a_union(
            a in proptest::collection::vec(VALUES, 0..300),
            b in proptest::collection::vec(VALUES, 0..300),
        ) {
            let mut set: PackedSet<u16> = a.iter().copied().collect();
            let mut other: PackedSet<u16> = b.iter().copied().collect();
            set.append(&mut other);
            check(&set);
            prop_assert!(other.is_empty());
            let model: BTreeSet<u16> = a.into_iter().chain(b).collect();
            prop_assert!(set.iter().copied().eq(model.iter().copied()));
        }
    }

    /// Jobs arriving in order ahead of a delayed one (the last entry)
    /// still fill their chunks.
    #[test]
    fn entries_added_in_order_ahead_of_a_later_one_fill_whole_chunks() {
        let mut set = PackedSet::default();
        set.insert(u32::MAX);
        for i in 0..10 * CHUNK as u32 {
            set.insert(i);
        }
        let lens: Vec<usize> = set.chunks.values().map(Vec::len).collect();
        assert_eq!(lens.len(), 11, "{lens:?}");
        assert!(lens[..10].iter().all(|&n| n == CHUNK), "{lens:?}");
        assert_eq!(set.iter().last(), Some(&u32::MAX));
    }

    /// Removing most entries in order, where each chunk's successor is
    /// still full, does not leave a chunk per entry.
    #[test]
    fn removals_in_order_through_full_chunks_merge_backwards() {
        let mut set: PackedSet<u32> = (0..20 * CHUNK as u32).collect();
        for i in 0..20 * CHUNK as u32 {
            if i % 8 != 0 {
                set.remove(&i);
            }
        }
        let left = 20 * CHUNK / 8;
        assert_eq!(set.iter().count(), left);
        assert!(
            set.chunks.len() <= left.div_ceil(CHUNK / 4),
            "{} chunks for {left} entries",
            set.chunks.len()
        );
    }

    #[test]
    fn entries_added_in_order_fill_whole_chunks() {
        let mut set = PackedSet::default();
        for i in 0..10 * CHUNK as u32 + 3 {
            set.insert(i);
        }
        let lens: Vec<usize> = set.chunks.values().map(Vec::len).collect();
        assert_eq!(lens.len(), 11);
        assert!(lens[..10].iter().all(|&n| n == CHUNK), "{lens:?}");
        assert!(set.chunks.values().all(|c| c.capacity() == CHUNK));
        // Taking from the front empties whole chunks.
        for i in 0..5 * CHUNK as u32 {
            assert_eq!(set.first(), Some(&i));
            assert!(set.remove(&i));
        }
        assert_eq!(set.chunks.len(), 6);
    }
}
