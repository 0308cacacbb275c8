//! [`PackedSet`]: a sorted set that stays packed when it grows at its end,
//! each entry a few bytes of difference from the one before it.
//!
//! A queue's PENDING jobs arrive mostly in order (`run_at` is the enqueue
//! time, ids rise) and leave mostly from the front. A `BTreeSet` grown
//! that way splits each full leaf in the middle and never fills it again:
//! 1M entries of 16 bytes took 35 MiB grown, 19 MiB built from sorted
//! input. Here entries live in sorted chunks of up to [`CHUNK`], keyed by
//! a lower bound; an entry past the end of a full last chunk starts a new
//! one, so a set grown in order is as packed as one built at once, also
//! ahead of a later entry (a delayed job): a full chunk splits where the
//! new entry goes when that is in its back half, in the middle otherwise.
//! A nearly empty chunk joins a neighbour when both fit in one.
//!
//! A chunk stores each entry as its difference from the entry before it
//! (the first from the chunk's key) in varints ([`Delta`]): jobs enqueued
//! in order differ by microseconds and an id or two, ~4 bytes where the
//! entry itself is 16 (1M entries: ~6 MiB with the chunks, not ~17). The
//! usual changes touch one end of a chunk: an entry past its last is
//! appended, and its first is taken off with the second re-written. Any
//! other insert or remove decodes the chunk's entries and encodes them
//! again, at most [`CHUNK`] of them.

use std::{
    collections::BTreeMap,
    ops::Bound::{Excluded, Unbounded},
};

use prost::encoding::{decode_varint, encode_varint};
use serde::{ser::SerializeSeq, Serialize, Serializer};

/// Most entries in one chunk: at most this many decoded and encoded again
/// by an insert or remove away from the chunk's ends.
const CHUNK: usize = 64;

/// An entry that a chunk stores as its difference from the one before it.
pub(crate) trait Delta: Ord + Copy {
    /// Appends `self` as its difference from `prev`, which is not above it.
    fn put_after(self, prev: Self, out: &mut Vec<u8>);

    /// Reads the entry that [`Delta::put_after`] wrote after `prev` from the
    /// front of `bytes`, and moves `bytes` past it.
    fn get_after(prev: Self, bytes: &mut &[u8]) -> Self;
}

/// Appends `value` as a varint (protobuf's, LEB128: 7 bits a byte).
pub(crate) fn put_varint(value: u64, out: &mut Vec<u8>) {
    encode_varint(value, out);
}

/// Reads a varint that [`put_varint`] wrote from the front of `bytes`.
pub(crate) fn get_varint(bytes: &mut &[u8]) -> u64 {
    decode_varint(bytes).unwrap_or_else(|_| unreachable!("a chunk holds the varints it wrote"))
}

/// The entries of one chunk.
#[derive(Debug, Clone)]
struct Chunk<T> {
    /// Each entry as its difference from the entry before it, the first
    /// from the chunk's key (which is not above it).
    bytes: Vec<u8>,
    /// How many entries, 1 to [`CHUNK`].
    len: usize,
    /// The last entry: appending needs only it.
    last: T,
}

impl<T: Delta> Chunk<T> {
    /// A chunk of `entries` (sorted, at least one, none below `key`).
    fn new(key: T, entries: &[T]) -> Chunk<T> {
        let mut bytes = Vec::new();
        let mut prev = key;
        for &entry in entries {
            entry.put_after(prev, &mut bytes);
            prev = entry;
        }
        bytes.shrink_to_fit();
        Chunk {
            bytes,
            len: entries.len(),
            last: prev,
        }
    }

    /// The entries in order (`key` is the chunk's).
    fn iter(&self, key: T) -> impl Iterator<Item = T> + '_ {
        let (mut bytes, mut prev) = (self.bytes.as_slice(), key);
        std::iter::from_fn(move || {
            if bytes.is_empty() {
                return None;
            }
            prev = T::get_after(prev, &mut bytes);
            Some(prev)
        })
    }

    /// The entries decoded, with room for one more.
    fn entries(&self, key: T) -> Vec<T> {
        let mut entries = Vec::with_capacity(self.len + 1);
        entries.extend(self.iter(key));
        entries
    }

    fn first(&self, key: T) -> T {
        T::get_after(key, &mut self.bytes.as_slice())
    }

    /// Appends `entry`, which is above the last.
    fn push(&mut self, entry: T) {
        entry.put_after(self.last, &mut self.bytes);
        self.len += 1;
        self.last = entry;
        if self.len == CHUNK {
            self.bytes.shrink_to_fit();
        }
    }

    /// Takes off the first entry, of two or more: the second is written
    /// again as its difference from the key.
    fn remove_first(&mut self, key: T) {
        let mut rest = self.bytes.as_slice();
        let first = T::get_after(key, &mut rest);
        let second = T::get_after(first, &mut rest);
        let read = self.bytes.len() - rest.len();
        let mut head = Vec::new();
        second.put_after(key, &mut head);
        self.bytes.splice(..read, head);
        self.len -= 1;
    }
}

/// A sorted set of `T` (module docs).
#[derive(Debug, Clone)]
pub(crate) struct PackedSet<T: Ord> {
    /// Non-empty sorted chunks by a separator key: no entry of a chunk is
    /// below its key, and every entry is below the next chunk's key. A key
    /// starts as the chunk's first entry and stays when that entry leaves,
    /// so taking from the front does not re-key a chunk.
    chunks: BTreeMap<T, Chunk<T>>,
}

impl<T: Ord> Default for PackedSet<T> {
    fn default() -> Self {
        PackedSet {
            chunks: BTreeMap::new(),
        }
    }
}

impl<T: Delta> PackedSet<T> {
    /// The least entry.
    pub(crate) fn first(&self) -> Option<T> {
        self.chunks
            .first_key_value()
            .map(|(&key, chunk)| chunk.first(key))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The entries in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = T> + '_ {
        self.chunks.iter().flat_map(|(&key, chunk)| chunk.iter(key))
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
            let mut entries = vec![entry];
            if let Some(first) = self.chunks.first_entry() {
                if first.get().len < CHUNK {
                    let key = *first.key();
                    entries.extend(first.remove().iter(key));
                }
            }
            self.chunks.insert(entry, Chunk::new(entry, &entries));
            return true;
        };
        let Some(chunk) = self.chunks.get_mut(&key) else {
            unreachable!("chunk_of returns a key of the map")
        };
        if entry > chunk.last {
            if chunk.len < CHUNK {
                chunk.push(entry);
            } else {
                // Past the end of a full chunk (the usual append): a new one.
                self.chunks.insert(entry, Chunk::new(entry, &[entry]));
            }
            return true;
        }
        let mut entries = chunk.entries(key);
        let at = match entries.binary_search(&entry) {
            Ok(_) => return false,
            Err(at) => at,
        };
        // Not past the last entry, so `at` is within the chunk.
        let right = if entries.len() < CHUNK {
            entries.insert(at, entry);
            None
        } else if at > CHUNK / 2 {
            // In the back half, as when jobs arrive in order ahead of a
            // delayed one: split where the entry goes, so the front chunk
            // ends full instead of half full for good.
            let right = entries.split_off(at);
            entries.push(entry);
            Some(right)
        } else {
            let right = entries.split_off(CHUNK / 2);
            entries.insert(at, entry);
            Some(right)
        };
        *chunk = Chunk::new(key, &entries);
        if let Some(right) = right {
            self.chunks.insert(right[0], Chunk::new(right[0], &right));
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
        if *entry > chunk.last {
            return false;
        }
        if chunk.first(key) == *entry {
            if chunk.len == 1 {
                self.chunks.remove(&key);
                return true;
            }
            chunk.remove_first(key);
        } else {
            let mut entries = chunk.entries(key);
            let Ok(at) = entries.binary_search(entry) else {
                return false;
            };
            // Not the first, so one or more entries stay.
            entries.remove(at);
            *chunk = Chunk::new(key, &entries);
        }
        let len = chunk.len;
        if len <= CHUNK / 4 {
            self.merge_small(key, len);
        }
        true
    }

    /// A chunk (`key`) left with `len` entries, a quarter or less: joins
    /// its successor or its predecessor if the two fit in one, so that
    /// removals in the middle cannot leave a chunk (and its allocation)
    /// per entry. Otherwise both neighbours are over three quarters full.
    fn merge_small(&mut self, key: T, len: usize) {
        let fits = |other: &Chunk<T>| len + other.len <= CHUNK;
        let next = self
            .chunks
            .range((Excluded(key), Unbounded))
            .next()
            .filter(|(_, next)| fits(next))
            .map(|(next_key, _)| *next_key);
        if let Some(next_key) = next {
            if let Some(next) = self.chunks.remove(&next_key) {
                if let Some(chunk) = self.chunks.get_mut(&key) {
                    next.iter(next_key).for_each(|entry| chunk.push(entry));
                    chunk.bytes.shrink_to_fit();
                }
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
                    chunk.iter(key).for_each(|entry| before.push(entry));
                    before.bytes.shrink_to_fit();
                }
            }
        }
    }

    /// Moves every entry of `other` into this set. Both are decoded a
    /// chunk at a time and merged into full chunks, so a merge of two large
    /// sets (a startup scan's parts) holds no list of all their entries.
    pub(crate) fn append(&mut self, other: &mut PackedSet<T>) {
        let (mut mine, mut theirs) = (
            std::mem::take(self).into_sorted().peekable(),
            std::mem::take(other).into_sorted().peekable(),
        );
        let merged = std::iter::from_fn(|| match (mine.peek(), theirs.peek()) {
            (Some(a), Some(b)) if a < b => mine.next(),
            (Some(a), Some(b)) if a == b => {
                theirs.next();
                mine.next()
            }
            (Some(_), Some(_)) | (None, Some(_)) => theirs.next(),
            (Some(_), None) => mine.next(),
            (None, None) => None,
        });
        *self = merged.collect();
    }

    /// Rebuilds the chunks full (after many inserts out of order).
    pub(crate) fn repack(&mut self) {
        *self = std::mem::take(self).into_sorted().collect();
    }

    fn len(&self) -> usize {
        self.chunks.values().map(|chunk| chunk.len).sum()
    }

    /// Bytes of the encoded entries, and how many chunks.
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> (usize, usize) {
        let bytes = self
            .chunks
            .values()
            .map(|chunk| chunk.bytes.capacity())
            .sum();
        (bytes, self.chunks.len())
    }

    /// The entries in order, each chunk decoded and dropped in turn.
    fn into_sorted(self) -> impl Iterator<Item = T> {
        self.chunks
            .into_iter()
            .flat_map(|(key, chunk)| chunk.entries(key))
    }
}

impl<T: Delta> PartialEq for PackedSet<T> {
    /// The same entries, however they are chunked.
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl<T: Delta> Eq for PackedSet<T> {}

impl<T: Delta> FromIterator<T> for PackedSet<T> {
    /// Full chunks from sorted input; other input is inserted one by one.
    fn from_iter<I: IntoIterator<Item = T>>(entries: I) -> Self {
        let mut set = PackedSet::default();
        let mut chunk: Vec<T> = Vec::with_capacity(CHUNK);
        let mut unsorted = Vec::new();
        for entry in entries {
            if chunk.last().is_some_and(|&last| last >= entry) {
                unsorted.push(entry);
                continue;
            }
            if chunk.len() == CHUNK {
                set.chunks.insert(chunk[0], Chunk::new(chunk[0], &chunk));
                chunk.clear();
            }
            chunk.push(entry);
        }
        if let Some(&first) = chunk.first() {
            set.chunks.insert(first, Chunk::new(first, &chunk));
        }
        for entry in unsorted {
            set.insert(entry);
        }
        set
    }
}

impl<T: Delta + Serialize> Serialize for PackedSet<T> {
    /// As a sequence of the entries in order, like a `BTreeSet`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // With its length first, which postcard needs.
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for entry in self.iter() {
            seq.serialize_element(&entry)?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    impl Delta for u16 {
        fn put_after(self, prev: Self, out: &mut Vec<u8>) {
            put_varint(u64::from(self - prev), out);
        }

        fn get_after(prev: Self, bytes: &mut &[u8]) -> Self {
            prev + u16::try_from(get_varint(bytes)).unwrap()
        }
    }

    impl Delta for u32 {
        fn put_after(self, prev: Self, out: &mut Vec<u8>) {
            put_varint(u64::from(self - prev), out);
        }

        fn get_after(prev: Self, bytes: &mut &[u8]) -> Self {
            prev + u32::try_from(get_varint(bytes)).unwrap()
        }
    }

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
    /// and below the next chunk's key; its length and last entry what its
    /// bytes hold.
    fn check(set: &PackedSet<u16>) {
        let mut last: Option<u16> = None;
        for (&key, chunk) in &set.chunks {
            let entries: Vec<u16> = chunk.iter(key).collect();
            assert!(!entries.is_empty() && entries.len() <= CHUNK, "{chunk:?}");
            assert_eq!(entries.len(), chunk.len);
            assert_eq!(entries.last(), Some(&chunk.last));
            assert!(last.is_none_or(|last| last < key), "below the key before");
            assert!(key <= entries[0]);
            for entry in entries {
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
                        let first = set.first();
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
            prop_assert!(set.iter().eq(model.iter().copied()));
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
            prop_assert!(set.iter().eq(model.iter().copied()));
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
        let lens: Vec<usize> = set.chunks.values().map(|chunk| chunk.len).collect();
        assert_eq!(lens.len(), 11, "{lens:?}");
        assert!(lens[..10].iter().all(|&n| n == CHUNK), "{lens:?}");
        assert_eq!(set.iter().last(), Some(u32::MAX));
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
        let lens: Vec<usize> = set.chunks.values().map(|chunk| chunk.len).collect();
        assert_eq!(lens.len(), 11);
        assert!(lens[..10].iter().all(|&n| n == CHUNK), "{lens:?}");
        // A full chunk holds no spare room, and one byte per entry here
        // (each 1 above the one before).
        for chunk in set.chunks.values().take(10) {
            assert_eq!(chunk.bytes.len(), CHUNK);
            assert_eq!(chunk.bytes.capacity(), CHUNK);
        }
        // Taking from the front empties whole chunks.
        for i in 0..5 * CHUNK as u32 {
            assert_eq!(set.first(), Some(i));
            assert!(set.remove(&i));
        }
        assert_eq!(set.chunks.len(), 6);
    }
}
