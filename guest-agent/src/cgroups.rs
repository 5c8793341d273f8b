//! cgroup v2 leaves for process trees (guest mode only), as guest/cgroups.py does them: each
//! exec/spawn gets a leaf `/sys/fs/cgroup/pandastack/p<N>`; emptied leaves are kept for the
//! next exec (creating one is most of a short exec's kernel work); the user subtree is capped
//! in processes and memory, the agent's own cgroup outweighs it for CPU and is reclaimed last.
//!
//! The child is born in its leaf (clone3 with CLONE_INTO_CGROUP, spawn.rs): the agent itself
//! never moves.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::raw::{c_char, c_int, c_ulong, c_void};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const ROOT: &str = "/sys/fs/cgroup";
const AGENT_CGROUP: &str = "agent";
const USER_PIDS_MAX: u64 = 1024;
const LEAF_PIDS_MAX: u64 = USER_PIDS_MAX - 128;
const AGENT_RESERVE_BYTES: u64 = 64 << 20;
const LATER_RESERVE_BYTES: u64 = 32 << 20;
const AGENT_CPU_WEIGHT: u64 = 10000;
const AGENT_MEMORY_LOW: u64 = 32 << 20;
const SPARE_LEAVES_MAX: usize = 8;
const EMPTY_POLL: Duration = Duration::from_millis(20);
const O_CLOEXEC: i32 = 0o2000000;

extern "C" {
    fn mount(src: *const c_char, target: *const c_char, fstype: *const c_char, flags: c_ulong,
             data: *const c_void) -> c_int;
}

fn write(path: &str, data: &str) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).custom_flags(O_CLOEXEC).open(path)?;
    f.write_all(data.as_bytes())
}

fn is_cgroup2_mounted(root: &str) -> bool {
    fs::read_to_string("/proc/self/mounts").unwrap_or_default().lines().any(|l| {
        let p: Vec<&str> = l.split_whitespace().collect();
        p.len() >= 3 && p[1] == root && p[2] == "cgroup2"
    })
}

fn mount_cgroup2(root: &str) -> io::Result<()> {
    fs::create_dir_all(root)?;
    let (src, target) = (CString::new("cgroup2").unwrap(), CString::new(root).unwrap());
    // favordynmods as the init script mounts it (kernels before 6.0 refuse it: then without).
    let fast = CString::new("favordynmods").unwrap();
    if unsafe { mount(src.as_ptr(), target.as_ptr(), src.as_ptr(), 0, fast.as_ptr() as *const c_void) } == 0 {
        return Ok(());
    }
    if unsafe { mount(src.as_ptr(), target.as_ptr(), src.as_ptr(), 0, std::ptr::null()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn meminfo(name: &str) -> Option<u64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.split(':').next() == Some(name))?;
    line.split(':').nth(1)?.split_whitespace().next()?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// memory.max of the user subtree: what the guest can still give when the agent starts, less
/// what the agent and the kernel need later (the reference's `user_memory_limit`).
fn user_memory_limit(total: u64, available: u64) -> u64 {
    (total.saturating_sub(AGENT_RESERVE_BYTES)).min(available.saturating_sub(LATER_RESERVE_BYTES)).max(total / 2)
}

fn own_cgroup(root: &str) -> String {
    for line in fs::read_to_string("/proc/self/cgroup").unwrap_or_default().lines() {
        if let Some(rest) = line.strip_prefix("0::") {
            let rel = rest.trim().trim_start_matches('/');
            return if rel.is_empty() { root.to_string() } else { format!("{}/{}", root, rel) };
        }
    }
    root.to_string()
}

struct Leaves {
    n: u64,
    stale: Vec<String>,
    spare: Vec<String>,
}

pub struct Cgroups {
    base: String,
    leaves: Mutex<Leaves>,
}

impl Cgroups {
    /// Mount cgroup2 if needed and create the base; None if cgroups are unusable.
    pub fn setup(root: &str) -> Option<Cgroups> {
        let cg = Cgroups {
            base: format!("{}/pandastack", root),
            leaves: Mutex::new(Leaves { n: 0, stale: Vec::new(), spare: Vec::new() }),
        };
        let ready = (|| -> io::Result<()> {
            if !is_cgroup2_mounted(root) {
                mount_cgroup2(root)?;
            }
            fs::create_dir_all(&cg.base)
        })();
        if let Err(e) = ready {
            eprintln!("pandastack-agent: cgroups unavailable, using process groups only: {}", e);
            return None;
        }
        if let Err(e) = cg.limit_user_processes(root) {
            eprintln!("pandastack-agent: cannot limit user processes: {}", e);
        }
        if let Err(e) = protect_agent(root) {
            eprintln!("pandastack-agent: cannot protect the agent from user processes: {}", e);
        }
        Some(cg)
    }

    fn limit_user_processes(&self, root: &str) -> io::Result<()> {
        write(&format!("{}/cgroup.subtree_control", root), "+pids +memory +cpu")?;
        write(&format!("{}/pids.max", self.base), &USER_PIDS_MAX.to_string())?;
        let total = meminfo("MemTotal").ok_or_else(|| io::Error::new(io::ErrorKind::Other, "no MemTotal"))?;
        let available = meminfo("MemAvailable").ok_or_else(|| io::Error::new(io::ErrorKind::Other, "no MemAvailable"))?;
        write(&format!("{}/memory.max", self.base), &user_memory_limit(total, available).to_string())?;
        // Each leaf its own CPU share and process limit: a bomb in one exec starves no other.
        write(&format!("{}/cgroup.subtree_control", self.base), "+cpu +pids")
    }

    /// An empty leaf (a spare one, or a new one) for the next process tree.
    pub fn take_leaf(&self) -> Option<String> {
        let mut l = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(leaf) = l.spare.pop() {
            return Some(leaf);
        }
        l.n += 1;
        let leaf = format!("{}/p{}", self.base, l.n);
        if let Err(e) = fs::create_dir(&leaf) {
            eprintln!("pandastack-agent: cgroup leaf {}: {}", leaf, e);
            return None;
        }
        // No such file: setup could not give the leaves a pids controller.
        let _ = write(&format!("{}/pids.max", leaf), &LEAF_PIDS_MAX.to_string());
        Some(leaf)
    }

    pub fn kill(&self, leaf: &str) {
        if let Err(e) = write(&format!("{}/cgroup.kill", leaf), "1") {
            if e.raw_os_error() != Some(2) {
                eprintln!("pandastack-agent: cgroup.kill {}: {}", leaf, e);
            }
        }
    }

    /// Wait until `deadline` for a killed leaf to hold no task, not even a zombie (a zombie's
    /// pid still counts towards the limits).
    pub fn wait_empty(&self, leaf: &str, deadline: Instant) {
        loop {
            match fs::read_to_string(format!("{}/pids.current", leaf)).ok().and_then(|t| t.trim().parse::<u64>().ok()) {
                Some(0) | None => return,
                Some(_) => {}
            }
            if Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(EMPTY_POLL);
        }
    }

    /// Keep the leaf for reuse (or remove it) once it is empty; retry stale ones each time.
    pub fn release(&self, leaf: String) {
        let mut l = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        let stale = std::mem::take(&mut l.stale);
        let mut keep: Vec<String> = stale.into_iter().filter(|p| !reclaim(&mut l.spare, p)).collect();
        if !reclaim(&mut l.spare, &leaf) {
            keep.push(leaf);
        }
        let from = keep.len().saturating_sub(1024);
        l.stale = keep.split_off(from);
    }
}

/// True if the leaf is empty and now spare or removed; false if processes remain.
fn reclaim(spare: &mut Vec<String>, leaf: &str) -> bool {
    if spare.len() >= SPARE_LEAVES_MAX {
        return match fs::remove_dir(leaf) {
            Ok(()) => true,
            Err(e) => e.raw_os_error() == Some(2),
        };
    }
    match fs::read_to_string(format!("{}/cgroup.events", leaf)) {
        Err(e) if e.raw_os_error() == Some(2) => true,
        Err(_) => false,
        Ok(text) => {
            let populated = text.contains("populated 1");
            if !populated {
                spare.push(leaf.to_string());
            }
            !populated
        }
    }
}

/// CPU weight and memory protection of the agent's own cgroup.
fn protect_agent(root: &str) -> io::Result<()> {
    let agent = format!("{}/{}", root, AGENT_CGROUP);
    fs::create_dir_all(&agent)?;
    if own_cgroup(root) != agent {
        // Started by hand, not by the init script (which puts the agent there first).
        write(&format!("{}/cgroup.procs", agent), &std::process::id().to_string())?;
    }
    write(&format!("{}/cpu.weight", agent), &AGENT_CPU_WEIGHT.to_string())?;
    write(&format!("{}/memory.low", agent), &AGENT_MEMORY_LOW.to_string())
}
