//! Frame codec (spec/guest-protocol.md §1), the same checks in the same order as the host's
//! reference codec, src/pandastack/guest/protocol.py.

use crate::json::{self, Value};

pub const MAGIC: &[u8; 2] = b"PS";
pub const VERSION: u8 = 1;
pub const PROTOCOL_VERSION: i128 = 1;
pub const PREFIX_SIZE: usize = 12;
pub const MAX_HEADER: usize = 65536;
pub const MAX_PAYLOAD: usize = 1 << 20;
pub const MAX_CHUNK: usize = 256 * 1024;
pub const INITIAL_WINDOW: u64 = 1 << 20;
pub const CREDIT_BATCH: u64 = 128 * 1024;
pub const MAX_ID: i128 = (1 << 53) - 1;
pub const HELLO_MAX_HEADER: usize = 4096;

pub struct Frame {
    pub header: Value,
    pub payload: Vec<u8>,
    pub t: String,
    pub id: u64,
}

impl Frame {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.header.get(key)
    }
}

pub fn encode(header: &Value, payload: &[u8]) -> Result<Vec<u8>, String> {
    let raw = json::to_string(header);
    if raw.len() > MAX_HEADER {
        return Err(format!("header too long: {} > {}", raw.len(), MAX_HEADER));
    }
    if payload.len() > MAX_PAYLOAD {
        return Err(format!("payload too long: {} > {}", payload.len(), MAX_PAYLOAD));
    }
    let mut out = Vec::with_capacity(PREFIX_SIZE + raw.len() + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(0);
    out.extend_from_slice(&(raw.len() as u32).to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(raw.as_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

fn be32(b: &[u8]) -> usize {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
}

/// Validate the 12-byte prefix: (header length, payload length).
pub fn parse_prefix(p: &[u8]) -> Result<(usize, usize), String> {
    if &p[0..2] != MAGIC {
        return Err(format!("bad magic {}", py_bytes(&p[0..2])));
    }
    if p[2] != VERSION {
        return Err(format!("unsupported frame version {}", p[2]));
    }
    if p[3] != 0 {
        return Err(format!("unsupported flags 0x{:02x}", p[3]));
    }
    let (hlen, plen) = (be32(&p[4..8]), be32(&p[8..12]));
    if !(1..=MAX_HEADER).contains(&hlen) {
        return Err(format!("header length {} out of range 1..{}", hlen, MAX_HEADER));
    }
    if plen > MAX_PAYLOAD {
        return Err(format!("payload length {} > {}", plen, MAX_PAYLOAD));
    }
    Ok((hlen, plen))
}

fn py_bytes(b: &[u8]) -> String {
    let mut s = String::from("b'");
    for &c in b {
        if (0x20..0x7f).contains(&c) && c != b'\'' && c != b'\\' {
            s.push(c as char);
        } else {
            s.push_str(&format!("\\x{:02x}", c));
        }
    }
    s.push('\'');
    s
}

pub fn parse_header(raw: &[u8]) -> Result<(Value, String, u64), String> {
    let text = std::str::from_utf8(raw).map_err(|e| format!("header is not UTF-8 JSON: {}", e))?;
    let obj = json::parse(text).map_err(|e| format!("header is not UTF-8 JSON: {}", e))?;
    if !matches!(obj, Value::Obj(_)) {
        return Err("header is not a JSON object".into());
    }
    let t = match obj.get("t").and_then(Value::as_str) {
        Some(t) if !t.is_empty() => t.to_string(),
        _ => return Err("header has no str 't'".into()),
    };
    let id = match obj.get("id").and_then(Value::as_int) {
        Some(i) if (0..=MAX_ID).contains(&i) => i as u64,
        _ => return Err("header has no valid int 'id'".into()),
    };
    Ok((obj, t, id))
}

#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn feed(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }
    pub fn clear(&mut self) {
        self.buf.clear();
    }
    /// Drop the first byte, so a later `scan` won't find the same bad frame.
    pub fn skip_bad(&mut self) {
        if !self.buf.is_empty() {
            self.buf.remove(0);
        }
    }
    fn decode_at(&self, start: usize, hlen: usize, plen: usize) -> Result<Frame, String> {
        let h = start + PREFIX_SIZE;
        let (header, t, id) = parse_header(&self.buf[h..h + hlen])?;
        Ok(Frame { header, payload: self.buf[h + hlen..h + hlen + plen].to_vec(), t, id })
    }
    pub fn next_frame(&mut self) -> Result<Option<Frame>, String> {
        let buf = &self.buf;
        if buf.len() < PREFIX_SIZE {
            let n = buf.len().min(2);
            if n > 0 && buf[..n] != MAGIC[..n] {
                return Err(format!("bad magic {}", py_bytes(&buf[..n])));
            }
            return Ok(None);
        }
        let (hlen, plen) = parse_prefix(&buf[..PREFIX_SIZE])?;
        let total = PREFIX_SIZE + hlen + plen;
        if buf.len() < total {
            return Ok(None);
        }
        let f = self.decode_at(0, hlen, plen)?;
        self.buf.drain(..total);
        Ok(Some(f))
    }

    /// Resync: the first complete frame `accept` takes, among candidates with a header of
    /// at most HELLO_MAX_HEADER bytes and no payload (protocol.py `FrameDecoder.scan`).
    pub fn scan<F: Fn(&Frame) -> bool>(&mut self, accept: F) -> Option<Frame> {
        let mut i = 0;
        let mut first_incomplete: Option<usize> = None;
        loop {
            let j = match find(&self.buf, i) {
                Some(j) => j,
                None => break,
            };
            if self.buf.len() - j < PREFIX_SIZE {
                first_incomplete.get_or_insert(j);
                break;
            }
            let (hlen, plen) = match parse_prefix(&self.buf[j..j + PREFIX_SIZE]) {
                Ok(x) => x,
                Err(_) => {
                    i = j + 1;
                    continue;
                }
            };
            if hlen > HELLO_MAX_HEADER || plen > 0 {
                i = j + 1;
                continue;
            }
            let end = j + PREFIX_SIZE + hlen + plen;
            if self.buf.len() < end {
                first_incomplete.get_or_insert(j);
                i = j + 1;
                continue;
            }
            if let Ok(f) = self.decode_at(j, hlen, plen) {
                if accept(&f) {
                    self.buf.drain(..end);
                    return Some(f);
                }
            }
            i = j + 1;
        }
        if let Some(j) = first_incomplete {
            self.buf.drain(..j);
        } else if self.buf.last() == Some(&MAGIC[0]) {
            let n = self.buf.len() - 1;
            self.buf.drain(..n);
        } else {
            self.buf.clear();
        }
        None
    }
}

fn find(buf: &[u8], from: usize) -> Option<usize> {
    if buf.len() < 2 {
        return None;
    }
    (from..buf.len() - 1).find(|&k| buf[k] == MAGIC[0] && buf[k + 1] == MAGIC[1])
}
