//! File names that are not UTF-8. The reference agent decodes them with Python's
//! surrogateescape (byte 0xXX becomes the lone surrogate U+DCXX) and its listings and watch
//! events carry that as a `\udcXX` JSON escape. A Rust String cannot hold a lone surrogate,
//! so such a byte lives in a String as a private-use code point, U+10FD00 + byte, which the
//! JSON writer turns into the same escape and `to_bytes` back into the byte.

const BASE: u32 = 0x10_FD00;

/// Bytes from the kernel as a String: UTF-8 where valid, each other byte escaped.
pub fn to_string(mut bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let good = e.valid_up_to();
                out.push_str(std::str::from_utf8(&bytes[..good]).unwrap_or(""));
                let bad = e.error_len().unwrap_or(bytes.len() - good);
                for &b in &bytes[good..good + bad] {
                    out.push(char::from_u32(BASE + b as u32).unwrap_or('\u{FFFD}'));
                }
                bytes = &bytes[good + bad..];
            }
        }
    }
}

/// The byte an escaped code point stands for, if it is one.
pub fn escaped_byte(c: char) -> Option<u8> {
    let n = c as u32;
    if (BASE + 0x80..=BASE + 0xFF).contains(&n) {
        Some((n - BASE) as u8)
    } else {
        None
    }
}

/// The kernel's bytes of a String made by `to_string`.
pub fn to_bytes(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        match escaped_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

pub fn path(s: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&to_bytes(s)))
}
