//! Latin-1 to UTF-8, for hosts whose strings are cheapest to hand over that way.
//!
//! CPython hands a `str` whose characters are all below U+0100 over as Latin-1 with a copy,
//! while its UTF-8 encoder goes character by character; the glue asks for Latin-1 where it can
//! and converts here, sixteen bytes at a time through runs of ASCII (the bulk of a checkpoint).

/// Bytes of UTF-8 gathered on the stack before they are appended to the output at once.
const BATCH: usize = 4096;

/// Append the text of `latin1` (one byte per character, U+0000..=U+00FF) to `out`.
pub fn push_latin1(out: &mut String, latin1: &[u8]) {
    out.reserve(latin1.len());
    let mut batch = [0u8; BATCH];
    let mut len = 0;
    for chunk in latin1.chunks(16) {
        if len + 16 > BATCH {
            flush(out, &batch[..len]);
            len = 0;
        }
        if chunk.len() == 16 {
            let mut word = [0u8; 16];
            word.copy_from_slice(chunk);
            if u128::from_ne_bytes(word) & 0x8080_8080_8080_8080_8080_8080_8080_8080 == 0 {
                batch[len..len + 16].copy_from_slice(&word);
                len += 16;
                continue;
            }
        }
        // A chunk with wider characters goes straight to `out`, character by character (so
        // that the batch stays ASCII, which checks fastest).
        flush(out, &batch[..len]);
        len = 0;
        out.extend(chunk.iter().map(|&c| char::from(c)));
    }
    flush(out, &batch[..len]);
}

/// Append `utf8` (which the caller made valid) to `out`. Checking it again is the price of
/// making a `str` without `unsafe`; it runs on a batch still in the cache.
#[inline]
fn flush(out: &mut String, utf8: &[u8]) {
    if let Ok(text) = std::str::from_utf8(utf8) {
        out.push_str(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin1_matches_std() {
        let all: Vec<u8> = (0..=255).collect();
        let mut long = vec![b'a'; 100];
        long.extend_from_slice(&all);
        long.extend_from_slice(&[b'z'; 33]);
        for bytes in [&all[..], &long, b"", b"ascii only, and long enough for a chunk", &[0xE9, 0xFC, 0x41]] {
            for skip in 0..bytes.len() {
                let want: String = bytes[skip..].iter().map(|&b| char::from(b)).collect();
                let mut out = String::from("prefix");
                push_latin1(&mut out, &bytes[skip..]);
                assert_eq!(&out[6..], want);
            }
        }
        // Longer than a batch: mostly two-byte characters, and mostly ASCII.
        for big in [all.repeat(BATCH / 100), [&[b'q'; BATCH + 3][..], &all, b"end"].concat()] {
            let mut out = String::new();
            push_latin1(&mut out, &big);
            assert_eq!(out, big.iter().map(|&b| char::from(b)).collect::<String>());
        }
    }
}
