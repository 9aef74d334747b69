//! Approval-token kernels: HMAC-SHA256 and the `v1` token MAC, mirroring
//! `python/durable_agent/_token_pure.py` (see `docs/tokens.md`) decision for decision.
//!
//! A token is `v1.<b64url(utf8(payload))>.<b64url(hmac_sha256(key, "v1.<payload segment>"))>`,
//! base64url canonical and unpadded. Policy (payload fields, expiry, key rotation) is not here.

use crate::b64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

pub const TOKEN_PREFIX: &str = "v1.";

/// HMAC-SHA256 of `message` under `key` (RFC 2104, any key length).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// Compare two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The `v1` token carrying `payload`, MACed with `key`.
pub fn token_sign(key: &[u8], payload: &str) -> String {
    let mut token = String::with_capacity(TOKEN_PREFIX.len() + payload.len() * 4 / 3 + 48);
    token.push_str(TOKEN_PREFIX);
    token.push_str(&b64::url_encode(payload.as_bytes()));
    let mac = b64::url_encode(&hmac_sha256(key, token.as_bytes()));
    token.push('.');
    token.push_str(&mac);
    token
}

/// The payload text of `token` if it is a `v1` token whose MAC verifies under `key`, else
/// `None`. The MAC is checked (in constant time) before anything of the payload is decoded.
pub fn token_verify(token: &str, key: &[u8]) -> Option<String> {
    if !token.starts_with(TOKEN_PREFIX) || !token.is_ascii() {
        return None;
    }
    let dot = token.rfind('.')?;
    if dot < TOKEN_PREFIX.len() {
        return None;
    }
    let body = &token[..dot];
    let expected = b64::url_encode(&hmac_sha256(key, body.as_bytes()));
    if !constant_time_eq(expected.as_bytes(), &token.as_bytes()[dot + 1..]) {
        return None;
    }
    let raw = b64::url_decode(&body[TOKEN_PREFIX.len()..])?;
    String::from_utf8(raw).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_then_verify() {
        let token = token_sign(b"k", "{\"a\":1}");
        assert_eq!(token_verify(&token, b"k").as_deref(), Some("{\"a\":1}"));
        assert_eq!(token_verify(&token, b"other"), None);
        let mut tampered = token.clone();
        tampered.push('A');
        assert_eq!(token_verify(&tampered, b"k"), None);
    }

    #[test]
    fn refuses_shapes() {
        for bad in ["", "v1", "v1.", "v2.abc.def", "v1.abc", "v1.\u{e9}.x"] {
            assert_eq!(token_verify(bad, b"k"), None, "{bad:?}");
        }
    }
}
