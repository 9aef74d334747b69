//! The kernels against the shared vectors in tests/vectors/ (the same files the Python
//! suite runs both implementations against).

use durable_agent_native::codec::{self, Value};
use durable_agent_native::{aead, b64, token};
use serde_json::Value as Json;
use std::path::PathBuf;

fn load(name: &str) -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("vector file is JSON")
}

fn from_tagged(node: &Json) -> Value {
    match node {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().expect("number")),
        },
        Json::String(s) => Value::Str(s.clone()),
        Json::Array(items) => Value::List(items.iter().map(from_tagged).collect()),
        Json::Object(map) => {
            if map.len() == 1 {
                let (tag, arg) = map.iter().next().expect("one entry");
                match tag.as_str() {
                    "#int" => {
                        let text = arg.as_str().expect("#int text");
                        return match text.parse::<i64>() {
                            Ok(i) => Value::Int(i),
                            Err(_) => Value::BigInt(text.to_owned()),
                        };
                    }
                    "#float" => return Value::Float(arg.as_str().expect("#float text").parse().expect("float")),
                    "#bytes" => return Value::Bytes(hex(arg.as_str().expect("#bytes hex"))),
                    "#str" => {
                        let cps: Vec<u32> =
                            arg.as_array().expect("#str").iter().map(|c| c.as_u64().unwrap() as u32).collect();
                        return match cps.iter().map(|&c| char::from_u32(c)).collect::<Option<String>>() {
                            Some(s) => Value::Str(s),
                            None => Value::LoneSurrogate,
                        };
                    }
                    "#dict" => {
                        return Value::Dict(
                            arg.as_array()
                                .expect("#dict pairs")
                                .iter()
                                .map(|pair| (from_tagged(&pair[0]), from_tagged(&pair[1])))
                                .collect(),
                        )
                    }
                    "#tuple" => return Value::List(arg.as_array().expect("#tuple").iter().map(from_tagged).collect()),
                    "#unsupported" => return Value::Unsupported(arg.as_str().expect("type name").to_owned()),
                    "#nest" => {
                        let mut value = from_tagged(&arg["leaf"]);
                        for _ in 0..arg["depth"].as_u64().expect("depth") {
                            value = Value::List(vec![value]);
                        }
                        return value;
                    }
                    _ => {}
                }
            }
            Value::Dict(map.iter().map(|(k, v)| (Value::Str(k.clone()), from_tagged(v))).collect())
        }
    }
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex")).collect()
}

/// Equality that tells 0.0 from -0.0 (and never meets NaN: decoding refuses it).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::List(x), Value::List(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        (Value::Dict(x), Value::Dict(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|((k1, v1), (k2, v2))| same(k1, k2) && same(v1, v2))
        }
        _ => a == b,
    }
}

fn vector_text(vector: &Json) -> Option<String> {
    if let Some(parts) = vector.get("text_parts") {
        return Some(
            parts
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p[0].as_str().unwrap().repeat(p[1].as_u64().unwrap() as usize))
                .collect(),
        );
    }
    if let Some(cps) = vector.get("text_codepoints") {
        // A text with a lone surrogate cannot be a Rust str: the host refuses it before the kernel.
        return cps.as_array().unwrap().iter().map(|c| char::from_u32(c.as_u64().unwrap() as u32)).collect();
    }
    Some(vector["text"].as_str().expect("text").to_owned())
}

#[test]
fn codec_encode_vectors() {
    let vectors = load("codec.json");
    let cases = vectors["encode"].as_array().expect("encode vectors");
    assert!(cases.len() > 50);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let value = from_tagged(&case["value"]);
        match (codec::encode(&value), case.get("text")) {
            (Ok(text), Some(want)) => {
                assert_eq!(text, want.as_str().unwrap(), "{name}");
                let back = codec::decode(&text).unwrap_or_else(|f| panic!("{name}: {f:?}"));
                assert_eq!(codec::encode(&back).as_deref(), Ok(text.as_str()), "{name}: round trip");
            }
            (Err(fault), None) => {
                assert_eq!(case["error"], "CodecError", "{name}");
                if let Some(message) = case.get("message") {
                    assert_eq!(fault.render(), message.as_str().unwrap(), "{name}");
                }
            }
            (got, _) => panic!("{name}: got {got:?}"),
        }
    }
}

#[test]
fn codec_decode_vectors() {
    let vectors = load("codec.json");
    let cases = vectors["decode"].as_array().expect("decode vectors");
    assert!(cases.len() > 50);
    let mut skipped = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let Some(text) = vector_text(case) else {
            skipped += 1;
            continue;
        };
        match (codec::decode(&text), case.get("value")) {
            (Ok(value), Some(want)) => assert!(same(&value, &from_tagged(want)), "{name}: {value:?}"),
            (Err(_), None) => assert_eq!(case["error"], "CodecError", "{name}"),
            (got, _) => panic!("{name}: got {got:?}"),
        }
    }
    assert_eq!(skipped, 1, "only the host-only lone-surrogate text is skipped");
}

fn secret(node: &Json) -> Vec<u8> {
    match node {
        Json::String(s) => s.as_bytes().to_vec(),
        Json::Object(map) => b64::std_decode(map["$bytes"].as_str().unwrap()).expect("canonical base64"),
        other => panic!("secret {other:?}"),
    }
}

#[test]
fn hmac_sha256_rfc_4231() {
    let vectors = load("tokens.json");
    let cases = vectors["hmac_sha256"].as_array().unwrap();
    assert!(cases.len() >= 6);
    for case in cases {
        let mac = token::hmac_sha256(&hex(case["key_hex"].as_str().unwrap()), &hex(case["data_hex"].as_str().unwrap()));
        assert_eq!(mac.to_vec(), hex(case["mac_hex"].as_str().unwrap()), "{}", case["name"]);
    }
}

#[test]
fn b64url_vectors() {
    let vectors = load("tokens.json");
    for case in vectors["b64url"]["valid"].as_array().unwrap() {
        let raw = hex(case["hex"].as_str().unwrap());
        let text = case["text"].as_str().unwrap();
        assert_eq!(b64::url_encode(&raw), text);
        assert_eq!(b64::url_decode(text), Some(raw));
    }
    for bad in vectors["b64url"]["invalid"].as_array().unwrap() {
        assert_eq!(b64::url_decode(bad.as_str().unwrap()), None, "{bad}");
    }
}

#[test]
fn token_sign_vectors() {
    let vectors = load("tokens.json");
    for case in vectors["signed"].as_array().unwrap() {
        let token = token::token_sign(&secret(&case["secret"]), case["payload_json"].as_str().unwrap());
        assert_eq!(token, case["token"].as_str().unwrap(), "{}", case["name"]);
    }
}

#[test]
fn token_verify_vectors() {
    let vectors = load("tokens.json");
    let cases = vectors["kernel_verify"].as_array().unwrap();
    assert!(cases.len() > 20);
    for case in cases {
        let got = token::token_verify(case["token"].as_str().unwrap(), &secret(&case["secret"]));
        assert_eq!(got.as_deref(), case["expected"].as_str(), "{}", case["name"]);
    }
}

fn associated_data(place: &Json) -> Vec<u8> {
    serde_json::to_string(place).expect("a place is JSON").into_bytes()
}

#[test]
fn associated_data_vectors() {
    for vector in load("encryption.json")["associated_data"].as_array().expect("associated_data") {
        assert_eq!(associated_data(&vector["place"]), hex(vector["hex"].as_str().expect("hex")), "{}", vector["place"]);
    }
}

fn keys(vectors: &Json, only: Option<&[&str]>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let held = vectors["keys"].as_object().expect("keys");
    held.iter()
        .filter(|(id, _)| only.is_none_or(|ids| ids.contains(&id.as_str())))
        .map(|(id, key)| (id.as_bytes().to_vec(), hex(key.as_str().expect("hex key"))))
        .collect()
}

#[test]
fn envelope_open_vectors() {
    let vectors = load("encryption.json");
    let held = keys(&vectors, None);
    let mut ring = aead::Ring::new(held.iter().map(|(id, key)| (&id[..], &key[..]))).expect("32-byte keys");
    let mut scratch = Vec::new();
    let mut opened = 0;
    for vector in vectors["envelopes"].as_array().expect("envelopes") {
        let place = associated_data(&vector["place"]);
        let binary = hex(vector["binary"].as_str().expect("binary hex"));
        for (envelope, stored) in [
            (vector["envelope"].as_str().expect("envelope").as_bytes(), aead::Stored::Text),
            (&binary[..], aead::Stored::Binary),
        ] {
            let got = aead::open_text(&mut ring, envelope, stored, &place, &mut scratch);
            match vector["plaintext"]["text"].as_str() {
                Some(text) => {
                    assert_eq!(got, Some(text), "{} ({stored:?})", vector["name"]);
                    opened += 1;
                }
                None => assert_eq!(got, None, "{}: a bytes plaintext is the reference's", vector["name"]),
            }
            let other = if stored == aead::Stored::Text { aead::Stored::Binary } else { aead::Stored::Text };
            assert_eq!(aead::open_text(&mut ring, envelope, other, &place, &mut scratch), None, "{}", vector["name"]);
        }
    }
    assert!(opened >= 4, "the file holds text envelopes");
}

#[test]
fn envelope_refused_vectors() {
    let vectors = load("encryption.json");
    let held = keys(&vectors, Some(&["k1", "k2"]));
    let mut ring = aead::Ring::new(held.iter().map(|(id, key)| (&id[..], &key[..]))).expect("32-byte keys");
    let mut scratch = Vec::new();
    let mut refused = 0;
    for (list, stored) in [("refused", aead::Stored::Text), ("refused_binary", aead::Stored::Binary)] {
        for vector in vectors[list].as_array().expect(list) {
            let envelope = match (vector["envelope"].as_str(), vector["hex"].as_str()) {
                (Some(text), _) if stored == aead::Stored::Text => text.as_bytes().to_vec(),
                (_, Some(bytes)) if stored == aead::Stored::Binary => hex(bytes),
                _ => continue, // a value that is not text (or bytes): the glue never passes it
            };
            let place = associated_data(&vector["place"]);
            let got = aead::open_text(&mut ring, &envelope, stored, &place, &mut scratch);
            assert_eq!(got, None, "{}: {}", list, vector["name"]);
            refused += 1;
        }
    }
    assert!(refused >= 20, "the file holds refused values of both forms");
}

/// The AES-256-GCM the kernel opens envelopes with (ring's) against the GCM specification's own test cases.
#[test]
fn aead_vectors() {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let vectors = load("encryption.json");
    for vector in vectors["aead"].as_array().expect("aead") {
        let field = |name: &str| hex(vector[name].as_str().expect("hex"));
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &field("key")).expect("a 32-byte key"));
        let nonce = || Nonce::try_assume_unique_for_key(&field("nonce")).expect("a 12-byte nonce");
        let mut sealed = field("plaintext");
        key.seal_in_place_append_tag(nonce(), Aad::from(field("aad")), &mut sealed).expect("seal");
        assert_eq!(sealed, field("sealed"), "{}", vector["name"]);
        let opened = key.open_in_place(nonce(), Aad::from(field("aad")), &mut sealed).expect("open");
        assert_eq!(opened, &field("plaintext")[..], "{}", vector["name"]);
    }
}
