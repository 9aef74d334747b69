//! Base64 (RFC 4648) in the two forms durable-agent stores, canonical only.
//!
//! * standard alphabet, padded: the checkpoint codec's `{"$bytes": "..."}`;
//! * URL-safe alphabet, unpadded: approval tokens.
//!
//! Decoding accepts exactly the texts the encoder produces (the canonical form) and
//! nothing else: no whitespace, no missing or extra padding, unused trailing bits zero.

use base64_simd::AsOut;

const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

const INVALID: u8 = 0xFF;

const fn decode_table(alphabet: &[u8; 64]) -> [u8; 256] {
    let mut table = [INVALID; 256];
    let mut i = 0;
    while i < 64 {
        table[alphabet[i] as usize] = i as u8;
        i += 1;
    }
    table
}

/// Two output characters for every 12-bit group (the standard alphabet): halves the lookups.
const fn pair_table(alphabet: &[u8; 64]) -> [[u8; 2]; 4096] {
    let mut table = [[0u8; 2]; 4096];
    let mut i = 0;
    while i < 4096 {
        table[i] = [alphabet[i >> 6], alphabet[i & 63]];
        i += 1;
    }
    table
}

static STD_PAIRS: [[u8; 2]; 4096] = pair_table(STD);
static STD_DECODE: [u8; 256] = decode_table(STD);
static URL_DECODE: [u8; 256] = decode_table(URL);

/// Why a text is not canonical base64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum B64Error {
    /// A character outside the alphabet, misplaced or missing padding, or an impossible length.
    Invalid,
    /// Decodable, but not what the encoder writes (non-zero unused bits).
    NonCanonical,
}

fn encode_into(out: &mut Vec<u8>, data: &[u8], alphabet: &[u8; 64], pad: bool) {
    let full = data.len() / 3;
    let tail = data.len() % 3;
    let written = full * 4
        + match (tail, pad) {
            (0, _) => 0,
            (_, true) => 4,
            (1, false) => 2,
            _ => 3,
        };
    let start = out.len();
    out.resize(start + written, b'=');
    let dst = &mut out[start..];
    if std::ptr::eq(alphabet, STD) {
        for (src, quad) in data.chunks_exact(3).zip(dst.chunks_exact_mut(4)) {
            let n = (usize::from(src[0]) << 16) | (usize::from(src[1]) << 8) | usize::from(src[2]);
            let [a, b] = STD_PAIRS[n >> 12];
            let [c, d] = STD_PAIRS[n & 0xFFF];
            quad.copy_from_slice(&[a, b, c, d]);
        }
    } else {
        for (src, quad) in data.chunks_exact(3).zip(dst.chunks_exact_mut(4)) {
            let n = (u32::from(src[0]) << 16) | (u32::from(src[1]) << 8) | u32::from(src[2]);
            quad[0] = alphabet[(n >> 18) as usize & 63];
            quad[1] = alphabet[(n >> 12) as usize & 63];
            quad[2] = alphabet[(n >> 6) as usize & 63];
            quad[3] = alphabet[n as usize & 63];
        }
    }
    let rest = &data[full * 3..];
    let dst = &mut dst[full * 4..];
    match rest {
        [a] => {
            let n = u32::from(*a) << 16;
            dst[0] = alphabet[(n >> 18) as usize & 63];
            dst[1] = alphabet[(n >> 12) as usize & 63];
        }
        [a, b] => {
            let n = (u32::from(*a) << 16) | (u32::from(*b) << 8);
            dst[0] = alphabet[(n >> 18) as usize & 63];
            dst[1] = alphabet[(n >> 12) as usize & 63];
            dst[2] = alphabet[(n >> 6) as usize & 63];
        }
        _ => {}
    }
}

/// Append the standard padded base64 of `data` to `out`.
pub fn std_encode_into(out: &mut Vec<u8>, data: &[u8]) {
    encode_into(out, data, STD, true);
}

/// The standard padded base64 of `data`.
pub fn std_encode(data: &[u8]) -> String {
    let mut out = Vec::new();
    std_encode_into(&mut out, data);
    String::from_utf8(out).unwrap_or_default()
}

/// The unpadded URL-safe base64 of `data`.
pub fn url_encode(data: &[u8]) -> String {
    let mut out = Vec::new();
    encode_into(&mut out, data, URL, false);
    String::from_utf8(out).unwrap_or_default()
}

/// The standard alphabet's decoding table for the character at position `slot` (0..4) of a
/// quad: its six bits already shifted into place in the quad's 24-bit value, and a bit above
/// those 24 for a character outside the alphabet, so that a quad is four lookups ORed together.
const fn shifted_table(slot: u32) -> [u32; 256] {
    let plain = decode_table(STD);
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = if plain[i] == INVALID { 1 << 24 } else { (plain[i] as u32) << (18 - 6 * slot) };
        i += 1;
    }
    table
}

static STD_SHIFTED: [[u32; 256]; 4] = [shifted_table(0), shifted_table(1), shifted_table(2), shifted_table(3)];

/// Decode `body` (no padding characters) whose length is not 1 mod 4, into `out`.
/// `out` must hold exactly `body.len() * 3 / 4` bytes.
fn decode_body(body: &[u8], table: &[u8; 256], out: &mut [u8]) -> Result<(), B64Error> {
    let quads = body.chunks_exact(4);
    let rest = quads.remainder();
    let o = body.len() / 4 * 3;
    if std::ptr::eq(table, &STD_DECODE) {
        // Errors are collected and checked once at the end: `out` is the caller's to discard.
        let [t0, t1, t2, t3] = &STD_SHIFTED;
        let mut bad = 0u32;
        let mut pairs = body.chunks_exact(8);
        let mut sextets = out.chunks_exact_mut(6);
        for (oct, dst) in (&mut pairs).zip(&mut sextets) {
            let x = t0[oct[0] as usize] | t1[oct[1] as usize] | t2[oct[2] as usize] | t3[oct[3] as usize];
            let y = t0[oct[4] as usize] | t1[oct[5] as usize] | t2[oct[6] as usize] | t3[oct[7] as usize];
            bad |= x | y;
            let n = (u64::from(x) << 24) | u64::from(y & 0xFF_FFFF);
            dst.copy_from_slice(&n.to_be_bytes()[2..]);
        }
        if let (Some(quad), Some(dst)) = (pairs.remainder().get(..4), sextets.into_remainder().get_mut(..3)) {
            let x = t0[quad[0] as usize] | t1[quad[1] as usize] | t2[quad[2] as usize] | t3[quad[3] as usize];
            bad |= x;
            dst.copy_from_slice(&x.to_be_bytes()[1..]);
        }
        if bad >> 24 != 0 {
            return Err(B64Error::Invalid);
        }
    } else {
        for (quad, triple) in quads.zip(out.chunks_exact_mut(3)) {
            let (a, b, c, d) =
                (table[quad[0] as usize], table[quad[1] as usize], table[quad[2] as usize], table[quad[3] as usize]);
            if (a | b | c | d) & 0xC0 != 0 {
                // INVALID (0xFF) is the only table entry with the high bits set
                return Err(B64Error::Invalid);
            }
            let n = (u32::from(a) << 18) | (u32::from(b) << 12) | (u32::from(c) << 6) | u32::from(d);
            triple[0] = (n >> 16) as u8;
            triple[1] = (n >> 8) as u8;
            triple[2] = n as u8;
        }
    }
    let mut n: u32 = 0;
    for &ch in rest {
        let v = table[ch as usize];
        if v == INVALID {
            return Err(B64Error::Invalid);
        }
        n = (n << 6) | u32::from(v);
    }
    match rest.len() {
        0 => Ok(()),
        2 => {
            if n & 0b1111 != 0 {
                return Err(B64Error::NonCanonical);
            }
            out[o] = (n >> 4) as u8;
            Ok(())
        }
        3 => {
            if n & 0b11 != 0 {
                return Err(B64Error::NonCanonical);
            }
            out[o] = (n >> 10) as u8;
            out[o + 1] = (n >> 2) as u8;
            Ok(())
        }
        _ => Err(B64Error::Invalid),
    }
}

/// The byte length `text` decodes to if it has the shape of canonical standard padded
/// base64 (length a multiple of 4, at most two trailing `=`), else `Invalid`.
/// Characters are checked by [`std_decode_into`].
pub fn std_decoded_len(text: &[u8]) -> Result<usize, B64Error> {
    if text.len() % 4 != 0 {
        return Err(B64Error::Invalid);
    }
    let pad = text.iter().rev().take(2).take_while(|&&c| c == b'=').count();
    Ok(text.len() / 4 * 3 - pad)
}

/// Decode canonical standard padded base64 into `out` (exactly [`std_decoded_len`] bytes).
pub fn std_decode_into(text: &[u8], out: &mut [u8]) -> Result<(), B64Error> {
    let len = std_decoded_len(text)?;
    if out.len() != len {
        return Err(B64Error::Invalid);
    }
    let pad = text.len() / 4 * 3 - len;
    if text.len() < SIMD_FROM {
        return decode_body(&text[..text.len() - pad], &STD_DECODE, out);
    }
    // Every quad but the last (which may be padded) with SIMD: those quads use all their bits,
    // so canonical is simply valid there, and '=' is outside the unpadded alphabet. The last
    // quad goes through the scalar decoder, which checks the padding and the unused bits.
    let head = text.len() - 4;
    let (head_out, tail_out) = out.split_at_mut(head / 4 * 3);
    base64_simd::STANDARD_NO_PAD.decode(&text[..head], head_out.as_out()).map_err(|_| B64Error::Invalid)?;
    decode_body(&text[head..text.len() - pad], &STD_DECODE, tail_out)
}

/// Texts at least this long are decoded with SIMD (see [`std_decode_into`]).
const SIMD_FROM: usize = 64;

/// Decode canonical standard padded base64.
pub fn std_decode(text: &str) -> Result<Vec<u8>, B64Error> {
    let mut out = vec![0; std_decoded_len(text.as_bytes())?];
    std_decode_into(text.as_bytes(), &mut out)?;
    Ok(out)
}

/// Decode canonical unpadded URL-safe base64; `None` for anything [`url_encode`] cannot produce.
pub fn url_decode(text: &str) -> Option<Vec<u8>> {
    let body = text.as_bytes();
    if body.len() % 4 == 1 {
        return None;
    }
    let mut out = vec![0; body.len() * 3 / 4];
    decode_body(body, &URL_DECODE, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4648_test_vectors() {
        let cases: [(&[u8], &str); 7] = [
            (b"", ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
        ];
        for (raw, text) in cases {
            assert_eq!(std_encode(raw), text);
            assert_eq!(std_decode(text).as_deref(), Ok(raw));
            let url = text.trim_end_matches('=');
            assert_eq!(url_encode(raw), url);
            assert_eq!(url_decode(url).as_deref(), Some(raw));
        }
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        for len in 0..all.len() {
            let text = std_encode(&all[..len]);
            assert_eq!(std_decode(&text).unwrap(), &all[..len]);
            let url = url_encode(&all[..len]);
            assert_eq!(url_decode(&url).unwrap(), &all[..len]);
        }
    }

    #[test]
    fn refuses_non_canonical_standard() {
        for bad in
            ["A", "AA", "AAA", "AA=", "=", "==", "A===", "AAAA=", "AA==AA==", "AA =", " AAA", "AA\n==", "-_AA", "AAA=A"]
        {
            assert_eq!(std_decode(bad), Err(B64Error::Invalid), "{bad:?}");
        }
        for bad in ["AB==", "AAB=", "//=="] {
            assert_eq!(std_decode(bad), Err(B64Error::NonCanonical), "{bad:?}");
        }
    }

    #[test]
    fn long_texts_decode_and_refuse_exactly_as_short_ones() {
        let raw: Vec<u8> = (0..600u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in (0..raw.len()).step_by(7).chain(40..70) {
            let text = std_encode(&raw[..len]);
            assert_eq!(std_decode(&text).as_deref(), Ok(&raw[..len]), "{len}");
            let mut scalar = vec![0; len];
            let pad = text.len() / 4 * 3 - len;
            assert_eq!(decode_body(&text.as_bytes()[..text.len() - pad], &STD_DECODE, &mut scalar), Ok(()));
            assert_eq!(scalar, &raw[..len]);
        }
        let text = std_encode(&raw[..301]); // 404 characters, the last quad "xx=="
        for at in 0..text.len() {
            for bad in [b'=', b' ', b'\n', b'-', b'_', b'"', b'\\', 0x80, 0xFF, 0] {
                let mut broken = text.clone().into_bytes();
                if broken[at] == bad {
                    continue;
                }
                broken[at] = bad;
                let padding_ok = bad == b'=' && at == text.len() - 1 && text.as_bytes()[at - 1] == b'=';
                let mut out = vec![0; 301];
                let got = std_decode_into(&broken, &mut out);
                assert!(padding_ok || got.is_err(), "{at} {bad}");
            }
        }
        // Non-canonical tails of long texts.
        let base = std_encode(&raw[..300]);
        for tail in ["AB==", "AAB=", "//=="] {
            assert_eq!(std_decode(&(base.clone() + tail)), Err(B64Error::NonCanonical), "{tail}");
        }
        for tail in ["A===", "AA=A", "=AAA", "AA", "AAAAA"] {
            assert_eq!(std_decode(&(base.clone() + tail)), Err(B64Error::Invalid), "{tail}");
        }
        let padded_inside = std_encode(&raw[..100]) + "AA==" + &std_encode(&raw[..99]);
        assert_eq!(std_decode(&padded_inside), Err(B64Error::Invalid));
    }

    #[test]
    fn refuses_non_canonical_urlsafe() {
        for bad in ["A", "AAAAA", "AA==", "AB", "AAB", "+/AA", "AA AA", "Zg="] {
            assert_eq!(url_decode(bad), None, "{bad:?}");
        }
    }
}
