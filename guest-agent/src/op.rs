//! One operation in flight: its credits, its inbox of stream frames, its cancellation, and
//! the argument checks every handler shares (guest/ops.py in the reference agent).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::agent::Shared;
use crate::frame::{Frame, CREDIT_BATCH, INITIAL_WINDOW, MAX_CHUNK};
use crate::json::{Obj, Value};
use crate::sys;

pub struct OpError {
    pub code: String,
    pub message: String,
    pub path: Option<String>,
}

impl OpError {
    pub fn new(code: &str, message: &str) -> OpError {
        OpError { code: code.to_string(), message: message.to_string(), path: None }
    }
    pub fn inval(message: &str) -> OpError {
        OpError::new("EINVAL", message)
    }
    pub fn with_path(mut self, path: &str) -> OpError {
        self.path = Some(path.to_string());
        self
    }
    /// As the reference builds it from an OSError: errno name, strerror text, file name.
    pub fn io(e: &io::Error, path: Option<&str>) -> OpError {
        let (code, message) = match e.raw_os_error() {
            Some(n) => (sys::errno_name(n).to_string(), sys::strerror_text(n)),
            None => ("EIO".to_string(), e.to_string()),
        };
        OpError { code, message, path: path.map(str::to_string) }
    }
}

pub type OpResult = Result<(), OpError>;

/// Bytes the peer lets us send on this op; `take` blocks until some exist or it closes.
pub struct Credit {
    state: Mutex<(u64, bool)>,
    cv: Condvar,
}

impl Credit {
    fn new(n: u64) -> Credit {
        Credit { state: Mutex::new((n, false)), cv: Condvar::new() }
    }
    pub fn add(&self, n: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 = s.0.saturating_add(n);
        self.cv.notify_all();
    }
    fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.cv.notify_all();
    }
    /// Up to `want` bytes of credit; 0 once closed.
    pub fn take(&self, want: u64) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while s.0 == 0 && !s.1 {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.1 {
            return 0;
        }
        let n = want.min(s.0);
        s.0 -= n;
        n
    }
}

type FrameFn = Box<dyn Fn(&Frame) + Send>;
type CancelFn = Arc<dyn Fn(&Op) + Send + Sync>;

struct State {
    inbox: VecDeque<Option<Frame>>,
    on_frame: Option<FrameFn>,
    on_cancel: Option<CancelFn>,
}

pub struct Op {
    pub id: u64,
    pub gen: u64,
    pub shared: Arc<Shared>,
    pub credit: Credit,
    grant: Mutex<u64>,
    cancelled: AtomicBool,
    explicit: AtomicBool,
    state: Mutex<State>,
    inbox_cv: Condvar,
    /// Set by a handler whose op outlives it (released later by `release`).
    pub keep: AtomicBool,
}

impl Op {
    pub fn new(f: &Frame, gen: u64, shared: Arc<Shared>) -> Op {
        Op {
            id: f.id,
            gen,
            shared,
            credit: Credit::new(INITIAL_WINDOW),
            grant: Mutex::new(0),
            cancelled: AtomicBool::new(false),
            explicit: AtomicBool::new(false),
            state: Mutex::new(State { inbox: VecDeque::new(), on_frame: None, on_cancel: None }),
            inbox_cv: Condvar::new(),
            keep: AtomicBool::new(false),
        }
    }

    /// `t {id, ...fields} + payload`, unless this op's connection is gone.
    pub fn send(&self, t: &str, payload: &[u8], fields: Obj) -> bool {
        let mut kv = vec![("t".to_string(), Value::from(t)), ("id".to_string(), Value::from(self.id))];
        kv.extend(fields.0);
        self.shared.send(&Value::Obj(kv), payload, self.gen)
    }

    /// `data` as `t` frames, waiting for credit; false if cancelled.
    pub fn send_data(&self, t: &str, data: &[u8]) -> bool {
        let mut rest = data;
        while !rest.is_empty() {
            let n = self.credit.take(rest.len().min(MAX_CHUNK) as u64) as usize;
            if n == 0 || self.is_cancelled() {
                return false;
            }
            if !self.send(t, &rest[..n], Obj::new()) {
                return false;
            }
            rest = &rest[n..];
        }
        true
    }

    /// We consumed `n` bytes the host sent on this op: grant credit back in batches.
    pub fn consumed(&self, n: u64) {
        let g = {
            let mut p = self.grant.lock().unwrap_or_else(|e| e.into_inner());
            *p += n;
            if *p >= CREDIT_BATCH {
                std::mem::replace(&mut *p, 0)
            } else {
                0
            }
        };
        if g > 0 {
            self.send("credit", b"", Obj::new().put("n", g));
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
    pub fn explicit_cancel(&self) -> bool {
        self.explicit.load(Ordering::SeqCst)
    }

    pub fn cancel(&self, explicit: bool) {
        let cb = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if self.cancelled.swap(true, Ordering::SeqCst) {
                return;
            }
            self.explicit.store(explicit, Ordering::SeqCst);
            st.inbox.push_back(None);
            self.inbox_cv.notify_all();
            st.on_cancel.clone()
        };
        self.credit.close();
        if let Some(cb) = cb {
            cb(self);
        }
    }

    /// Route stream frames to `on_frame` from now on (earlier ones are replayed to it) and
    /// call `on_cancel` on cancellation (at once if it already happened).
    pub fn set_handlers(&self, on_frame: FrameFn, on_cancel: CancelFn) {
        let cancelled = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let early: Vec<Frame> = st.inbox.drain(..).flatten().collect();
            for f in &early {
                on_frame(f);
            }
            st.on_frame = Some(on_frame);
            st.on_cancel = Some(on_cancel.clone());
            self.is_cancelled()
        };
        if cancelled {
            on_cancel(self);
        }
    }

    /// A stream frame from the host (reader thread; never blocks).
    pub fn on_frame(&self, f: Frame) {
        match f.t.as_str() {
            "credit" => {
                if let Some(n) = f.get("n").and_then(Value::as_int) {
                    if n > 0 {
                        self.credit.add(n.min(u64::MAX as i128) as u64);
                    }
                }
            }
            "cancel" => self.cancel(true),
            _ => {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                match &st.on_frame {
                    Some(h) => h(&f),
                    None => {
                        st.inbox.push_back(Some(f));
                        self.inbox_cv.notify_all();
                    }
                }
            }
        }
    }

    /// The next inbox item: Ok(Some(frame)), Ok(None) once cancelled, Err on timeout.
    pub fn next_frame(&self, timeout: Duration) -> Result<Option<Frame>, ()> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(item) = st.inbox.pop_front() {
                return Ok(item);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(());
            }
            st = self.inbox_cv.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    pub fn release(&self) {
        self.shared.release(self);
    }
}

// -- argument checks, with the reference's messages -------------------------------------

pub fn arg_str(h: &Value, key: &str, default: Option<&str>) -> Result<String, OpError> {
    let v = match h.get(key) {
        Some(v) => v.as_str().map(str::to_string),
        None => default.map(str::to_string),
    };
    match v {
        Some(s) if !(s.is_empty() && matches!(key, "path" | "src" | "dst")) => {
            if s.contains('\0') {
                Err(OpError::inval(&format!("'{}' contains NUL", key)))
            } else {
                Ok(s)
            }
        }
        _ => Err(OpError::inval(&format!("'{}' must be a non-empty string", key))),
    }
}

pub fn arg_opt_str(h: &Value, key: &str) -> Result<Option<String>, OpError> {
    match h.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => arg_str(h, key, None).map(Some),
    }
}

pub fn arg_int(h: &Value, key: &str, default: Option<i128>, lo: i128) -> Result<i128, OpError> {
    let v = match h.get(key) {
        Some(v) => v.as_int(),
        None => default,
    };
    match v {
        Some(i) if i >= lo => Ok(i),
        _ => Err(OpError::inval(&format!("'{}' must be an int >= {}", key, lo))),
    }
}

pub fn arg_opt_int(h: &Value, key: &str, lo: i128) -> Result<Option<i128>, OpError> {
    match h.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => arg_int(h, key, None, lo).map(Some),
    }
}

pub fn arg_bool(h: &Value, key: &str, default: bool) -> Result<bool, OpError> {
    match h.get(key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(OpError::inval(&format!("'{}' must be a bool", key))),
    }
}
