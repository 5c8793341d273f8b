//! The threads requests run on: a finished worker waits for the next request instead of
//! exiting, up to `MAX_IDLE` of them; past that, a request gets a new thread.
//!
//! Why keep them: a template's warm-up leaves idle workers in its snapshot, so the first
//! request after a restore wakes one (a futex) instead of making a thread (mmap of a stack,
//! clone, the C library's thread start-up), code that under TCG runs translated afresh after
//! every restore (docs/benchmarks-floor.md). An idle worker blocks in a condition wait: no
//! wakeups.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex};

const MAX_IDLE: usize = 4;
const STACK_BYTES: usize = 256 * 1024;

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    idle: usize,
}

#[derive(Default)]
pub struct Workers {
    q: Mutex<Queue>,
    ready: Condvar,
}

impl Workers {
    /// Run `job` on an idle worker, or on a new one; Err (the job dropped) if no thread
    /// could be made.
    pub fn run(self: &Arc<Self>, job: Job) -> io::Result<()> {
        {
            let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
            // Each queued job has an idle worker of its own that has not taken it yet.
            if q.idle > q.jobs.len() {
                q.jobs.push_back(job);
                self.ready.notify_one();
                return Ok(());
            }
        }
        let me = self.clone();
        std::thread::Builder::new().stack_size(STACK_BYTES).spawn(move || {
            job();
            me.serve();
        })?;
        Ok(())
    }

    fn serve(&self) {
        loop {
            let job = {
                let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
                if q.idle >= MAX_IDLE {
                    return;
                }
                q.idle += 1;
                while q.jobs.is_empty() {
                    q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                q.idle -= 1;
                q.jobs.pop_front()
            };
            if let Some(job) = job {
                job();
            }
        }
    }
}
