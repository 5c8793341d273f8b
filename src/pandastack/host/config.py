"""Host runtime configuration, read from the environment with safe defaults."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from pandastack.host.objects.config import ObjectStoreConfig
from pandastack.rules import DEFAULT_HOME, MAX_VOLUMES_PER_SANDBOX

DEFAULT_MEMORY_STAGE = Path("/dev/shm/pandastack-memory")
FORK_BUFFERS_ROOT = Path("/run/pandastack-fork-buffers")
HUGETLB_CLAIMS_ROOT = Path("/run/pandastack-hugetlb")
# One claims dir per network namespace, whatever PANDASTACK_HOME is (ADR 0021).
DEFAULT_NETWORK_CLAIMS = DEFAULT_HOME / "network" / "claims"
AUTO_STREAM_HUGETLB_MB = 2048  # four 512 MiB sandboxes
ACCEL_CHOICES = ("auto", "kvm", "tcg")
GUEST_ASLR_CHOICES = ("auto", "on", "off")
STREAM_HUGE_PAGES_CHOICES = ("auto", "on", "off")


#: An idle guest's periodic kernel work that a sandbox has no use for, each a wakeup of the
#: guest and so of its VMM on the host (ftrace of an idle clone, 20 s: 39 wakeups of kcompactd,
#: 144 ticks; with these, 1 and 47): proactive compaction polls every 500 ms for huge pages
#: the guest never asks for; per-CPU VM statistics are folded every second (their drift is
#: bounded by a per-CPU threshold, not by the interval); the soft-lockup detector's timer
#: fires every 4 s and under a loaded TCG host only reports false lockups. Measured, 10 idle
#: clones of each template at once: a VMM 0.27 % of a core as baked before, 0.07 % with these
#: (docs/benchmarks.md, "Idle CPU: what an idle guest wakes for").
GUEST_IDLE_ARGS = " nowatchdog sysctl.vm.compaction_proactiveness=0 sysctl.vm.stat_interval=60"
#: Under TCG the guest's code never runs on the host CPU, speculatively or not: QEMU runs its
#: own translation of it, so the guest kernel's speculation defences (retpolines, RSB filling,
#: swapgs barriers) defend nothing and are code every clone translates again.
TCG_ARGS = " mitigations=off"

@dataclass(frozen=True)
class PeerCerts:
    """The agent's own certificate and key and the operator's CA: with them, the streams
    agents open to each other (a live migration's memory, a direct fork's snapshot) are
    mutual TLS, each side showing its certificate (ADR 0048, addendum)."""

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class HostConfig:
    """Where the runtime keeps its files and how it runs VMs.

    `home` holds caches and templates (shared by every runtime on the machine); `state_dir`
    holds one directory per live sandbox. Tests point `state_dir` at a private directory so
    they can assert that nothing is left behind, while still sharing the template cache.
    """

    home: Path = DEFAULT_HOME
    state_dir: Path | None = None
    snapshots_root: Path | None = None
    # Where durable volumes live (PANDASTACK_VOLUMES_DIR); None: `<home>/volumes`.
    volumes_root: Path | None = None
    # Volume slots every VM has (PANDASTACK_VOLUME_SLOTS, 0..4; part of the templates'
    # key): 0 gives templates without them, and sandboxes mount no volumes (ADR 0027).
    volume_slots: int = MAX_VOLUMES_PER_SANDBOX
    network_pool: str = "10.200.0.0/16"
    # Where network slots are claimed: every runtime in one network namespace must use the
    # same one (PANDASTACK_NETWORK_CLAIMS; ADR 0021). None: DEFAULT_NETWORK_CLAIMS.
    network_claims: Path | None = None
    # "auto": the host's own resolver; "off": no DNS for guests; or an IPv4 address.
    dns: str = "auto"
    # Host ports of the egress proxy that enforces domain rules (on each slot's host address;
    # the same for every runtime on the host, and used by nothing else there).
    egress_http_port: int = 15080
    egress_tls_port: int = 15443
    # CIDRs of the always-denied ranges (network.ALWAYS_DENIED: private, metadata...) that a
    # sandbox policy may open by an allow_out entry; no other part of them is ever reachable.
    network_operator_allow: tuple[str, ...] = ()
    accel: str = "auto"
    tb_size_mb: int = 64
    tcg_cpu: str = "max"
    # Address-space randomization of processes inside the guest. "auto": off under TCG, where
    # it makes every process translate its shared libraries again (ADR 0009), on under KVM.
    guest_aslr: str = "auto"
    # The VMM driver, by name (host/vmm/factory.py knows them): PANDASTACK_VMM.
    vmm: str = "qemu"
    qemu_binary: str = "qemu-system-x86_64"
    # The jailed VMM (ADR 0036): each VMM as its own uid (`jail_uid_base` + network slot),
    # chrooted, seccomp-filtered, in a cgroup sized by its machine. PANDASTACK_JAIL=off turns
    # it off (for debugging); it needs root, and is off by itself where the host is not.
    jail: bool = True
    jail_uid_base: int = 200_000
    # Each VM's disks (root and volumes) are throttled by its VMM to this much per vCPU, so
    # one sandbox's I/O cannot take the host's disk from its neighbours; 0: not throttled.
    # PANDASTACK_DISK_MBPS_PER_VCPU, PANDASTACK_DISK_IOPS_PER_VCPU.
    disk_mbps_per_vcpu: int = 256
    disk_iops_per_vcpu: int = 4096
    # Whether a jailed VMM may write-protect guest RAM for short-pause snapshots: sets the
    # host-wide vm.unprivileged_userfaultfd=1 (ADR 0036). PANDASTACK_JAIL_USERFAULTFD=off
    # leaves the sysctl alone; TCG snapshots then stop the guest for the whole save.
    jail_userfaultfd: bool = True
    # Template memory files are copied to tmpfs so that snapshots can leave the guest running
    # (host/memory/stage.py); None keeps them where they are (snapshots then stop the guest).
    memory_stage_dir: Path | None = DEFAULT_MEMORY_STAGE
    # What the staged copies may hold in all (MiB); None: a quarter of the host's memory.
    memory_stage_mb: int | None = None
    # Transparent huge pages for VMs restored from a stream (snapshot, fork, wake). "auto":
    # on, unless the host hands freed memory back to its hypervisor (host/vmm/qemu/driver.py).
    stream_huge_pages: str = "auto"
    # Forks write their streams into a warm tmpfs buffer, released this many seconds after
    # the last fork (host/memory/fork_buffer.py, ADR 0010); 0: into the snapshot directory.
    fork_buffer_s: float = 60.0
    # MiB of 2 MiB hugetlb pages this runtime adds to the kernel's pool for the RAM of VMs
    # restored from a stream (host/memory/huge_pool.py, ADR 0011); 0: none. None ("auto"):
    # AUTO_STREAM_HUGETLB_MB (at most 1/8 of the host's memory) where the host hands freed
    # memory back to its hypervisor, else 0.
    stream_hugetlb_mb: int | None = None
    # MiB of the host's memory that VM starts must leave available (MemAvailable, less what
    # starts under way reserved): below it creates, forks, wakes and incoming migrations are
    # refused with HostMemoryExhausted, before the kernel's OOM killer picks a process (ADR
    # 0050). None ("auto"): 5 % of MemTotal, at least 1 GiB (host/memory/admission.py says
    # why). PANDASTACK_MEMORY_RESERVE_MB.
    memory_reserve_mb: int | None = None
    # How long the guest-agent client waits for one answer of the guest; for an exec with a
    # timeout, also its grace past that timeout (the guest kills the process tree then and
    # reports the exit once the tree is gone: guest/procs.py KILLED_GRACE). The host API's
    # client waits longer still (hostclient EXEC_ANSWER_GRACE_S) for this host's answer.
    agent_timeout_s: float = 30.0
    # False: sandboxes get no network at all (no slot, namespace, tap or egress proxy), and
    # the runtime leaves the host's network alone. Only for drivers whose VMs have no NIC
    # (the unit tests' fake VMM): the QEMU driver refuses it.
    networking: bool = True
    # The object store that hosts share snapshots and hibernated sandboxes through (ADR
    # 0020): PANDASTACK_OBJECT_STORE. None: snapshots and hibernations stay on this host.
    object_store: ObjectStoreConfig | None = None
    # Where fetched objects are kept (ADR 0016); None: `<home>/objects-cache`.
    objects_cache: Path | None = None
    # What the objects cache may hold, in MiB (PANDASTACK_OBJECTS_CACHE_MB): beyond it the
    # least recently used chunks and files that nothing outside the cache links to are
    # evicted after each fetch (ADR 0016). None: no bound.
    objects_cache_mb: int | None = None
    # Mutual TLS on the agent-to-agent streams (`pandastack agent --tls-cert --tls-key
    # --tls-client-ca`); None: plain TCP guarded by a one-time token.
    peer_tls: PeerCerts | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, choices in (("accel", ACCEL_CHOICES), ("guest_aslr", GUEST_ASLR_CHOICES),
                              ("stream_huge_pages", STREAM_HUGE_PAGES_CHOICES)):
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"{name} must be one of {choices}, not {value!r}")
        if not 0 <= self.volume_slots <= MAX_VOLUMES_PER_SANDBOX:
            raise ValueError(f"volume_slots must be between 0 and {MAX_VOLUMES_PER_SANDBOX}")
        for name in ("disk_mbps_per_vcpu", "disk_iops_per_vcpu"):
            if not 0 <= getattr(self, name) <= 1 << 20:
                raise ValueError(f"{name} must be between 0 (off) and {1 << 20}, "
                                 f"not {getattr(self, name)}")
        if not 1000 <= self.jail_uid_base <= 2**32 - 2**17:
            raise ValueError(f"jail_uid_base must leave room for every slot's uid, not "
                             f"{self.jail_uid_base}")
        if self.memory_reserve_mb is not None and self.memory_reserve_mb < 0:
            raise ValueError(f"memory_reserve_mb must be 0 or more, not {self.memory_reserve_mb}")
        if self.stream_hugetlb_mb is not None and self.stream_hugetlb_mb < 0:
            raise ValueError(f"stream_hugetlb_mb must be 0 or more, not {self.stream_hugetlb_mb}")

    @classmethod
    def from_env(cls, **overrides: object) -> HostConfig:
        # An empty setting is an unset one: an environment file (the systemd unit's) easily
        # holds `NAME=` lines, and an empty path would mean the working directory.
        env = {name: value for name, value in os.environ.items()
               if value.strip() or not name.startswith("PANDASTACK_")}
        values: dict[str, object] = {
            "home": Path(env.get("PANDASTACK_HOME", str(DEFAULT_HOME))),
            "accel": env.get("PANDASTACK_ACCEL", "auto"),
            "vmm": env.get("PANDASTACK_VMM", "qemu"),
        }
        if "PANDASTACK_DNS" in env:
            values["dns"] = env["PANDASTACK_DNS"]
        for port in ("egress_http_port", "egress_tls_port"):
            if f"PANDASTACK_{port.upper()}" in env:
                values[port] = int(env[f"PANDASTACK_{port.upper()}"])
        from pandastack.hostport.network import operator_allow_from

        values["network_operator_allow"] = operator_allow_from(env)
        if "PANDASTACK_NETWORK_POOL" in env:
            values["network_pool"] = env["PANDASTACK_NETWORK_POOL"]
        if "PANDASTACK_NETWORK_CLAIMS" in env:
            values["network_claims"] = Path(env["PANDASTACK_NETWORK_CLAIMS"])
        if "PANDASTACK_SNAPSHOTS_DIR" in env:
            values["snapshots_root"] = Path(env["PANDASTACK_SNAPSHOTS_DIR"])
        if "PANDASTACK_VOLUMES_DIR" in env:
            values["volumes_root"] = Path(env["PANDASTACK_VOLUMES_DIR"])
        if env.get("PANDASTACK_VOLUME_SLOTS", "").strip():
            values["volume_slots"] = int(env["PANDASTACK_VOLUME_SLOTS"])
        if "PANDASTACK_STATE_DIR" in env:
            values["state_dir"] = Path(env["PANDASTACK_STATE_DIR"])
        if "PANDASTACK_GUEST_ASLR" in env:
            values["guest_aslr"] = env["PANDASTACK_GUEST_ASLR"]
        if "PANDASTACK_TCG_CPU" in env:
            values["tcg_cpu"] = env["PANDASTACK_TCG_CPU"]
        if "PANDASTACK_MEMORY_STAGE" in env:
            stage = env["PANDASTACK_MEMORY_STAGE"]
            values["memory_stage_dir"] = Path(stage) if stage != "off" else None
        if "PANDASTACK_MEMORY_STAGE_MB" in env:
            values["memory_stage_mb"] = int(env["PANDASTACK_MEMORY_STAGE_MB"])
        if "PANDASTACK_STREAM_HUGE_PAGES" in env:
            values["stream_huge_pages"] = env["PANDASTACK_STREAM_HUGE_PAGES"]
        if "PANDASTACK_FORK_BUFFER_S" in env:
            values["fork_buffer_s"] = float(env["PANDASTACK_FORK_BUFFER_S"])
        if env.get("PANDASTACK_STREAM_HUGETLB_MB", "auto") != "auto":
            values["stream_hugetlb_mb"] = int(env["PANDASTACK_STREAM_HUGETLB_MB"])
        if env.get("PANDASTACK_MEMORY_RESERVE_MB", "auto").strip() != "auto":
            values["memory_reserve_mb"] = int(env["PANDASTACK_MEMORY_RESERVE_MB"])
        if env.get("PANDASTACK_JAIL", "").strip():
            values["jail"] = env["PANDASTACK_JAIL"].strip().lower() not in ("off", "0", "no",
                                                                           "false")
        if env.get("PANDASTACK_JAIL_USERFAULTFD", "").strip():
            values["jail_userfaultfd"] = env["PANDASTACK_JAIL_USERFAULTFD"].strip().lower() \
                not in ("off", "0", "no", "false")
        for var, name in (("PANDASTACK_DISK_MBPS_PER_VCPU", "disk_mbps_per_vcpu"),
                          ("PANDASTACK_DISK_IOPS_PER_VCPU", "disk_iops_per_vcpu")):
            if env.get(var, "").strip():
                values[name] = int(env[var])
        if env.get("PANDASTACK_JAIL_UID_BASE", "").strip():
            values["jail_uid_base"] = int(env["PANDASTACK_JAIL_UID_BASE"])
        if "PANDASTACK_TB_SIZE_MB" in env:
            values["tb_size_mb"] = int(env["PANDASTACK_TB_SIZE_MB"])
        values["object_store"] = ObjectStoreConfig.from_env(env)
        if env.get("PANDASTACK_OBJECTS_CACHE_MB", "").strip():
            values["objects_cache_mb"] = int(env["PANDASTACK_OBJECTS_CACHE_MB"])
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    def guest_kernel_args(self, accel: str) -> str:
        """Kernel parameters that templates baked under `accel` add to the image's own."""
        aslr = self.guest_aslr == "on" or (self.guest_aslr == "auto" and accel == "kvm")
        # Under TCG the guest's TSC follows the host's clock, and it is the guest's jiffies
        # that fall behind on a loaded host: the clocksource watchdog then drops the TSC for
        # jiffies, and a template baked so keeps a periodic tick (HZ interrupts a second) in
        # every clone. Measured: 3 of 5 bakes under load without it, 0 of 6 with it (ADR 0038,
        # addendum). Under KVM the watchdog checks against a real clock, so it stays.
        tsc = " tsc=reliable" if accel == "tcg" else ""
        after = GUEST_IDLE_ARGS + (TCG_ARGS if accel == "tcg" else "")
        return ("" if aslr else " norandmaps") + tsc + after

    @property
    def sandboxes_dir(self) -> Path:
        return self.state_dir if self.state_dir is not None else self.home / "sandboxes"

    @property
    def dns_upstream(self) -> str | None:
        if self.dns == "off":
            return None
        if self.dns == "auto":
            from pandastack.host.network.manager import host_resolver

            return host_resolver()
        return self.dns

    @property
    def network_claims_dir(self) -> Path:
        """Not under `home`: runtimes with their own homes still share a network namespace
        (its slot indexes, names and addresses), so they must share its claims."""
        return self.network_claims if self.network_claims is not None else DEFAULT_NETWORK_CLAIMS

    @property
    def snapshots_dir(self) -> Path:
        return self.snapshots_root if self.snapshots_root is not None else self.home / "snapshots"

    @property
    def volumes_dir(self) -> Path:
        return self.volumes_root if self.volumes_root is not None else self.home / "volumes"

    @property
    def fork_buffer_dir(self) -> Path:
        """Where the fork buffer's tmpfs is mounted: one per state dir, so runtimes (and test
        sessions) with their own state never share one."""
        return FORK_BUFFERS_ROOT / self._state_key

    @property
    def hugetlb_claim(self) -> Path:
        """This runtime's claim on the kernel's hugetlb pool; one per state dir."""
        return HUGETLB_CLAIMS_ROOT / f"{self._state_key}.claim"

    def stream_hugetlb_pages(self, host_reports_free_pages: bool, host_memory_mb: int) -> int:
        """The 2 MiB pages to add to the hugetlb pool, "auto" resolved for this host (never
        more than an eighth of its memory: the pages are held whether VMs use them or not)."""
        mb = self.stream_hugetlb_mb
        if mb is None:
            mb = min(AUTO_STREAM_HUGETLB_MB, host_memory_mb // 8) if host_reports_free_pages else 0
        return mb // 2

    @property
    def _state_key(self) -> str:
        return hashlib.sha256(str(self.sandboxes_dir.resolve()).encode()).hexdigest()[:16]

    @property
    def templates_dir(self) -> Path:
        return self.home / "templates"

    @property
    def builds_dir(self) -> Path:
        """The template build step cache. Its entries name snapshots of this runtime's
        snapshot store, so it lives beside that store (a private store, private cache)."""
        return self.snapshots_dir.parent / (self.snapshots_dir.name + "-build-cache")

    @property
    def objects_cache_dir(self) -> Path:
        from pandastack.host.objects.cache import cache_dir_of

        return self.objects_cache if self.objects_cache is not None else cache_dir_of(self.home)

    @property
    def fetched_templates_dir(self) -> Path:
        """Where templates fetched from the object store are laid out: beside the cache of
        their files, so both live on one file system (hard links) and go together."""
        return self.objects_cache_dir.parent / "templates-fetched"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"
