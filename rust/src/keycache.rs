//! The decoder's cache of object keys: one shared value per distinct key, at a bounded cost per
//! key whatever the keys are.
//!
//! A checkpoint repeats a few keys thousands of times (`"role"`, `"content"`), so the decoder
//! makes one string object per distinct key, as `json.loads` does. But the keys come from
//! untrusted text, and the hash is fixed (no entropy is drawn, on any platform): keys sharing a
//! hash are cheap to make, and a hash table that chains or probes without bound then does work
//! quadratic in their number (40,000 such keys in 1.6 MB once took the decoder 5 s). So a lookup
//! here looks at no more than [`PROBES`] slots, and when all of them hold other keys the key is
//! simply not cached: the caller makes a fresh value. Colliding keys cost sharing, never time.
//!
//! Open addressing with linear probing. The table doubles whenever an insertion would make it
//! more than half full, up to [`MAX_SLOTS`]; an entry that finds no free slot within `PROBES`
//! of its home when the table doubles is dropped (this is a cache).

/// The most slots one lookup looks at.
pub const PROBES: usize = 8;
/// The table does not grow beyond this many slots.
pub const MAX_SLOTS: usize = 1 << 16;
const MIN_SLOTS: usize = 16;
const MULTIPLIER: u64 = 0xf135_7aea_2e62_a9c5;

/// The hash of a key: FxHash's word-at-a-time multiply over its UTF-8, then a final word for
/// its length and a terminator. Its top bits (which depend on every bit of the key) pick the
/// home slot.
pub fn key_hash(key: &[u8]) -> u64 {
    let add = |hash: u64, word: u64| (hash ^ word).wrapping_mul(MULTIPLIER);
    let mut hash = 0;
    let mut words = key.chunks_exact(8);
    for chunk in &mut words {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        hash = add(hash, u64::from_le_bytes(word));
    }
    let rest = words.remainder();
    let mut word = [0u8; 8];
    word[..rest.len()].copy_from_slice(rest);
    hash = add(hash, u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
    add(hash, 0xff)
}

/// The work a cache has done: `probes` (slots looked at) never exceeds `PROBES * lookups`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub lookups: usize,
    pub probes: usize,
    /// Keys held now.
    pub cached: usize,
}

struct Entry<V> {
    hash: u64,
    key: Box<str>,
    value: V,
}

enum Probe<V> {
    Found(V),
    Free(usize),
    Full,
}

/// Shared values by key (see the module docs).
pub struct KeyCache<V> {
    /// A power of two long, or empty until the first insertion.
    slots: Vec<Option<Entry<V>>>,
    stats: Stats,
}

impl<V: Clone> Default for KeyCache<V> {
    fn default() -> Self {
        KeyCache { slots: Vec::new(), stats: Stats::default() }
    }
}

impl<V: Clone> KeyCache<V> {
    /// A cache whose table starts with room for about `keys` keys.
    pub fn with_capacity(keys: usize) -> Self {
        let size = (keys * 2).clamp(MIN_SLOTS, MAX_SLOTS).next_power_of_two();
        KeyCache { slots: empty_slots(size), stats: Stats::default() }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The value shared for `key`, made by `make` (and cached, if a slot is free) on a miss.
    pub fn get_or_insert_with(&mut self, key: &str, make: impl FnOnce() -> V) -> V {
        self.stats.lookups += 1;
        let hash = key_hash(key.as_bytes());
        if (self.stats.cached + 1) * 2 > self.slots.len() && self.slots.len() < MAX_SLOTS {
            self.grow();
        }
        match self.probe(hash, key) {
            Probe::Found(value) => value,
            Probe::Free(at) => {
                let value = make();
                self.slots[at] = Some(Entry { hash, key: key.into(), value: value.clone() });
                self.stats.cached += 1;
                value
            }
            Probe::Full => make(),
        }
    }

    /// Look for `key` in at most `PROBES` slots from its home: found, or the first free slot.
    fn probe(&mut self, hash: u64, key: &str) -> Probe<V> {
        let (home, mask) = home_of(hash, self.slots.len());
        for step in 0..PROBES.min(self.slots.len()) {
            self.stats.probes += 1;
            let at = (home + step) & mask;
            match &self.slots[at] {
                None => return Probe::Free(at),
                Some(entry) if entry.hash == hash && *entry.key == *key => return Probe::Found(entry.value.clone()),
                Some(_) => {}
            }
        }
        Probe::Full
    }

    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, empty_slots(size));
        self.stats.cached = 0;
        for entry in old.into_iter().flatten() {
            let (home, mask) = home_of(entry.hash, size);
            let free = (0..PROBES).map(|step| (home + step) & mask).find(|&at| self.slots[at].is_none());
            if let Some(at) = free {
                self.slots[at] = Some(entry);
                self.stats.cached += 1;
            }
        }
    }
}

/// The home slot of `hash` in a table of `size` slots (a power of two, at least 2), and the mask.
fn home_of(hash: u64, size: usize) -> (usize, usize) {
    ((hash >> (64 - size.trailing_zeros())) as usize, size - 1)
}

fn empty_slots<V>(size: usize) -> Vec<Option<Entry<V>>> {
    std::iter::repeat_with(|| None).take(size).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` distinct printable 16-byte keys sharing one hash. The words `w0`, `w1` of a
    /// 16-byte key enter the hash only as `w0 * MULTIPLIER ^ w1`, so every key with
    /// `w1 = TARGET ^ w0 * MULTIPLIER` collides; byte j of the product depends on bytes 0..=j of
    /// `w0` alone, so `w0` is chosen byte by byte, keeping that byte of `w1` printable.
    fn colliding_keys(count: usize) -> Vec<String> {
        const TARGET: u64 = 0x5f5f_5f5f_5f5f_5f5f;
        fn printable(byte: u64) -> bool {
            (0x21..0x7f).contains(&byte) && byte != u64::from(b'"') && byte != u64::from(b'\\')
        }
        fn search(j: u32, w0: u64, count: usize, out: &mut Vec<String>) {
            if j == 8 {
                let w1 = TARGET ^ w0.wrapping_mul(MULTIPLIER);
                let mut bytes = w0.to_le_bytes().to_vec();
                bytes.extend_from_slice(&w1.to_le_bytes());
                out.push(String::from_utf8(bytes).expect("printable ASCII"));
                return;
            }
            let shift = 8 * j;
            for byte in (0x21..0x7f).filter(|&b| printable(b)) {
                let w = w0 | (byte << shift);
                if printable(((TARGET ^ w.wrapping_mul(MULTIPLIER)) >> shift) & 0xff) {
                    search(j + 1, w, count, out);
                    if out.len() == count {
                        return;
                    }
                }
            }
        }
        let mut out = Vec::new();
        search(0, 0, count, &mut out);
        out
    }

    #[test]
    fn colliding_keys_cost_at_most_probes_per_lookup() {
        let keys = colliding_keys(20_000);
        assert_eq!(keys.len(), 20_000);
        let hash = key_hash(keys[0].as_bytes());
        assert!(keys.iter().all(|key| key_hash(key.as_bytes()) == hash));
        let mut cache = KeyCache::default();
        let mut made = 0usize;
        for round in 0..2 {
            for key in &keys {
                let value = cache.get_or_insert_with(key, || {
                    made += 1;
                    key.clone()
                });
                assert_eq!(&value, key);
            }
            let stats = cache.stats();
            assert_eq!(stats.lookups, keys.len() * (round + 1));
            assert!(stats.probes <= PROBES * stats.lookups, "{stats:?}");
            assert_eq!(stats.cached, PROBES);
        }
        // Only the first PROBES keys were cached; every other lookup made a fresh value.
        assert_eq!(made, 2 * keys.len() - PROBES);
    }

    #[test]
    fn ordinary_keys_are_shared_and_survive_growth() {
        let keys: Vec<String> = (0..5000).map(|i| format!("key-{i}")).collect();
        let mut cache = KeyCache::default();
        for key in &keys {
            cache.get_or_insert_with(key, || key.clone());
        }
        let held = cache.stats().cached;
        assert!(held > 4900, "{held}");
        let mut misses = 0;
        for key in &keys {
            assert_eq!(
                cache.get_or_insert_with(key, || {
                    misses += 1;
                    key.clone()
                }),
                *key
            );
        }
        assert_eq!(misses, keys.len() - held);
        assert!(cache.stats().probes <= PROBES * cache.stats().lookups);
    }

    #[test]
    fn the_table_stops_growing() {
        let mut cache = KeyCache::with_capacity(10);
        for i in 0..(MAX_SLOTS * 2) {
            let key = i.to_string();
            cache.get_or_insert_with(&key, || i);
        }
        assert_eq!(cache.slots.len(), MAX_SLOTS);
        assert!(cache.stats().cached <= MAX_SLOTS);
        assert_eq!(cache.get_or_insert_with("7", || 0), 7);
    }
}
