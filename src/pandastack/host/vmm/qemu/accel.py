"""The accelerator QEMU's VMs run on, chosen by proof, not by the presence of /dev/kvm.

On some hosts /dev/kvm exists but only runs specially enlightened guests (PVM): an ordinary
kernel hangs silently or QEMU aborts. So `auto` boots the real guest kernel under KVM in probe
mode with a deadline and uses KVM only if the initramfs reports back; otherwise TCG. The verdict
is cached per (host kernel, QEMU, guest kernel) so the probe runs once per machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

from pandastack.host.vmm.driver import KernelSpec
from pandastack.host.vmm.qemu.command import qemu_version

PROBE_MARKER = b"PANDASTACK_PROBE_OK"
PROBE_DEADLINE_S = 10.0


def resolve_accel(requested: str, kernel: KernelSpec, cache_dir: Path,
                  binary: str = "qemu-system-x86_64") -> str:
    if requested in ("kvm", "tcg"):
        return requested
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    ident = "|".join([os.uname().release, qemu_version(binary), str(kernel.kernel),
                      str(kernel.kernel.stat().st_size)])
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    cached = cache_dir / "accel" / f"{key}.json"
    if cached.exists():
        verdict = json.loads(cached.read_text())["accel"]
        return str(verdict)
    accel = "kvm" if probe_kvm(kernel, binary) else "tcg"
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({"accel": accel, "probed_at": time.time(), "ident": ident}))
    return accel


def probe_kvm(kernel: KernelSpec, binary: str, deadline_s: float = PROBE_DEADLINE_S) -> bool:
    """Boot the guest kernel under KVM into the initramfs probe mode; True if it reports back."""
    argv = [
        binary, "-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
        "-accel", "kvm", "-cpu", "host", "-M", "microvm", "-m", "256", "-smp", "1",
        "-kernel", str(kernel.kernel), "-initrd", str(kernel.initrd),
        "-append", "console=ttyS0 quiet panic=-1 pandastack.probe=1",
        "-serial", "stdio",
    ]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
    except OSError:
        return False
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    seen = b""
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            chunk = proc.stdout.read(65536)
            if chunk:
                seen = (seen + chunk)[-4096:]
                if PROBE_MARKER in seen:
                    return True
            elif proc.poll() is not None:
                return False
            else:
                time.sleep(0.02)
        return False
    finally:
        proc.kill()
        proc.wait()
