//! pandastack's guest agent as one static binary (ADR 0038): the protocol of
//! spec/guest-protocol.md, version 1, frame for frame as the reference agent in
//! src/pandastack/guest/ (the host's codec stays the reference).
//!
//! `pandastack-agent --guest` in the VM; `pandastack-agent --fd N` in tests (never touches
//! the clock, hostname, machine-id or RNG of the machine it runs on).
//!
//! Locks are taken with `unwrap_or_else(into_inner)` throughout: a panic in one operation
//! must not poison a lock and so take every later operation (or the reader) down with it.

mod agent;
mod cgroups;
mod channel;
mod code;
mod execs;
mod files;
mod frame;
mod json;
mod metrics;
mod op;
mod osstr;
mod procs;
mod program;
mod pty;
mod search;
mod spawn;
mod sys;
mod sysinit;
mod table;
mod users;
mod volumes;
mod watch;
mod workers;

use std::time::Duration;

fn usage() -> i32 {
    eprintln!("usage: pandastack-agent (--guest [--port-name NAME] [--port-wait SECONDS] | --fd N)");
    2
}

fn main() {
    std::process::exit(real_main());
}

fn real_main() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut fd: Option<i32> = None;
    let mut guest = false;
    let mut port_name = channel::PORT_NAME.to_string();
    let mut port_wait = 10.0f64;
    let mut code_socket = code::SOCKET_PATH.to_string();
    let mut i = 0;
    while i < args.len() {
        let val = args.get(i + 1).cloned();
        match args[i].as_str() {
            "--guest" => guest = true,
            "--fd" => {
                fd = val.and_then(|v| v.parse().ok());
                if fd.is_none() {
                    return usage();
                }
                i += 1;
            }
            "--port-name" => {
                port_name = match val {
                    Some(v) => v,
                    None => return usage(),
                };
                i += 1;
            }
            "--port-wait" => {
                port_wait = match val.and_then(|v| v.parse().ok()) {
                    Some(v) => v,
                    None => return usage(),
                };
                i += 1;
            }
            "--code-socket" => {
                code_socket = match val {
                    Some(v) => v,
                    None => return usage(),
                };
                i += 1;
            }
            // The reference agent's option; this agent logs only failures.
            "--log-level" => i += 1,
            _ => return usage(),
        }
        i += 1;
    }
    if guest {
        // Once, at the template's cold boot: every clone restored from it has the answer in
        // its memory (reading a disk's serial is an I/O request to the VMM, ~20 ms each under
        // TCG, paid at every volume mount otherwise).
        volumes::learn_disks();
    }
    let chan = match (guest, fd) {
        (true, None) => match channel::Channel::open_port(&port_name, Duration::from_secs_f64(port_wait)) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("pandastack-agent: {}", e);
                return 1;
            }
        },
        (false, Some(fd)) => channel::Channel::from_fd(fd),
        _ => return usage(),
    };
    // Commands run in /work unless told otherwise, as with the reference agent.
    agent::run(chan, guest, if guest { Some("/work".to_string()) } else { None }, code_socket)
}
