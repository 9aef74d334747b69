//! AES-256-GCM envelopes (docs/encryption.md): opening the text form, for loading encrypted checkpoints in
//! batches.
//!
//! ```text
//! envelope = "enc1t." key_id "." base64( nonce[12] || ciphertext || tag[16] )   (stored as text)
//!          | "enc1t." key_id "." nonce[12] || ciphertext || tag[16]           (stored as binary)
//! GCM AAD  = "enc1t." key_id "." || associated_data(place)
//! ```
//!
//! This is only the fast path of `durable_agent.encryption`'s `Keyring.open`, for the envelopes a store
//! reads by the thousand (a checkpoint's message rows). An envelope [`open_text`] opens is one the reference
//! opens to the same text. Anything else is `None` here: not an envelope, a bytes plaintext (`enc1b`), a key id
//! the ring does not hold, base64 that is not canonical, a tag that does not verify, a plaintext that is not
//! UTF-8. The caller hands such a value to the reference, which says what is wrong with it, so the errors
//! are written once, in Python.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

use crate::b64;

pub const KEY_BYTES: usize = 32;
pub const NONCE_BYTES: usize = 12;
pub const TAG_BYTES: usize = 16;
const TEXT_MARKER: &[u8] = b"enc1t.";
const MAX_KEY_ID: usize = 64;

/// The keys of a keyring by id; each key's AES schedule is prepared when an envelope first names it.
pub struct Ring<'k> {
    keys: Vec<(&'k [u8], &'k [u8], Option<LessSafeKey>)>,
}

impl<'k> Ring<'k> {
    /// A ring of `(key id, 32-byte key)` pairs; `None` if a key is not 32 bytes.
    pub fn new(keys: impl IntoIterator<Item = (&'k [u8], &'k [u8])>) -> Option<Self> {
        let keys: Vec<_> = keys.into_iter().map(|(id, key)| (id, key, None)).collect();
        keys.iter().all(|(_, key, _)| key.len() == KEY_BYTES).then_some(Ring { keys })
    }

    fn cipher(&mut self, key_id: &[u8]) -> Option<&LessSafeKey> {
        let (_, key, cipher) = self.keys.iter_mut().find(|(id, _, _)| *id == key_id)?;
        if cipher.is_none() {
            *cipher = Some(LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).ok()?));
        }
        cipher.as_ref()
    }
}

/// The length of the header (`enc1t.` key id `.`) that starts `envelope`; `None` if it does not start with one.
fn text_header_len(envelope: &[u8]) -> Option<usize> {
    let rest = envelope.strip_prefix(TEXT_MARKER)?;
    let id_len = rest.iter().take(MAX_KEY_ID + 1).position(|&c| c == b'.')?;
    let valid = |c: &u8| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_';
    (id_len >= 1 && rest[..id_len].iter().all(valid)).then_some(TEXT_MARKER.len() + id_len + 1)
}

/// How an envelope is stored: text (its body in base64: a str) or binary (its body raw: bytes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Stored {
    Text,
    Binary,
}

/// The text `envelope` (an envelope of a text plaintext, stored as `stored` says) seals, when it was sealed for
/// the place whose associated data is `place` under a key of `ring`; else `None` (module docs). `scratch` is
/// reused between calls: it holds the associated data, then the body.
pub fn open_text<'s>(
    ring: &mut Ring<'_>,
    envelope: &[u8],
    stored: Stored,
    place: &[u8],
    scratch: &'s mut Vec<u8>,
) -> Option<&'s str> {
    let header = text_header_len(envelope)?;
    let cipher = ring.cipher(&envelope[TEXT_MARKER.len()..header - 1])?;
    let encoded = &envelope[header..];
    let body_len = match stored {
        Stored::Text => b64::std_decoded_len(encoded).ok()?,
        Stored::Binary => encoded.len(),
    };
    if body_len < NONCE_BYTES + TAG_BYTES {
        return None;
    }
    scratch.clear();
    scratch.extend_from_slice(&envelope[..header]);
    scratch.extend_from_slice(place);
    let aad_len = scratch.len();
    match stored {
        Stored::Text => {
            scratch.resize(aad_len + body_len, 0);
            b64::std_decode_into(encoded, &mut scratch[aad_len..]).ok()?;
        }
        Stored::Binary => scratch.extend_from_slice(encoded),
    }
    let (aad, body) = scratch.split_at_mut(aad_len);
    let (nonce, sealed) = body.split_at_mut(NONCE_BYTES);
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    let plaintext = cipher.open_in_place(nonce, Aad::from(&*aad), sealed).ok()?;
    std::str::from_utf8(plaintext).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    #[test]
    fn a_header_is_the_marker_a_key_id_and_a_dot() {
        assert_eq!(text_header_len(b"enc1t.k1.AAAA"), Some(9));
        assert_eq!(text_header_len(b"enc1t.k-_9.x"), Some(11));
        for refused in [&b"enc1b.k1.AAAA"[..], b"enc1t..AAAA", b"enc1t.k 1.AAAA", b"enc1t.k1", b"{\"role\":1}", b""] {
            assert_eq!(text_header_len(refused), None, "{:?}", String::from_utf8_lossy(refused));
        }
        let longest = format!("enc1t.{}.", "k".repeat(MAX_KEY_ID));
        assert_eq!(text_header_len(longest.as_bytes()), Some(longest.len()));
        assert_eq!(text_header_len(format!("enc1t.{}.", "k".repeat(MAX_KEY_ID + 1)).as_bytes()), None);
    }

    #[test]
    fn a_key_of_another_size_makes_no_ring() {
        assert!(Ring::new([(&b"k1"[..], &[0u8; 16][..])]).is_none());
        assert!(Ring::new([(&b"k1"[..], &KEY[..])]).is_some());
    }

    #[test]
    fn what_does_not_open_is_none() {
        let mut ring = Ring::new([(&b"k1"[..], &KEY[..])]).unwrap();
        let mut scratch = Vec::new();
        for value in [
            "enc1t.k2.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "enc1t.k1.AAAA",
            "enc1t.k1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "enc1t.k1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        ] {
            assert_eq!(open_text(&mut ring, value.as_bytes(), Stored::Text, b"[\"p\"]", &mut scratch), None, "{value}");
            assert_eq!(
                open_text(&mut ring, value.as_bytes(), Stored::Binary, b"[\"p\"]", &mut scratch),
                None,
                "{value}"
            );
        }
    }
}
