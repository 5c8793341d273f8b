"""Errors a host raises through the host port (in-process, or carried over the host API by
type name and re-raised by its client: the control plane sees the same classes either way).

    HostError
    ├── SetupError            host preparation (packages, images, templates) failed
    │   ├── TemplateNotFound  no template of that name
    │   └── ImageError        an OCI image could not be pulled (its message names it)
    │       ├── ImageNotFound         no such repository, tag or digest (or no linux/amd64)
    │       ├── RegistryAuthError     the registry refused the credentials (or wants some)
    │       ├── RegistryUnavailable   the registry did not answer within the deadline
    │       ├── ImageTooLarge         over the image size, layer count or unpacked bounds
    │       └── ImageInvalid          not an image we can use (digest, format, unsafe entry)
    ├── VMMError              the VMM could not start, restore, snapshot or stop a VM
    │   ├── HugePagesUnavailable  too few free hugetlb pages for a VM's RAM
    │   └── SnapshotFailed    a live snapshot failed (the sandbox keeps running)
    ├── SandboxNotFound       no such sandbox on this host
    ├── SnapshotNotFound      no such snapshot on this host
    ├── SandboxStateError     the sandbox is in a state that does not allow the operation
    ├── VolumeNotFound        no such volume on this host
    ├── VolumeInUse           the volume is attached where the operation needs it detached
    ├── CodeInterpreterError  the sandbox's code interpreter refused or could not run a request
    │   ├── CodeInterpreterUnavailable  the sandbox's template has no (running) code interpreter
    │   ├── CodeContextNotFound         no code context with that id
    │   └── UnsupportedLanguage         no such language, or not in this template
    ├── HostUnavailable       the host agent cannot be reached (its process is down or restarting)
    │   └── HostLost          its host stopped heartbeating and was fenced (its VM is gone)
    ├── HostExhausted         the host (or every host) has no room for the sandbox
    │   └── HostMemoryExhausted  starting the VM would leave less than the host's memory reserve
    ├── ObjectStoreError      the object store refused a request or sent other bytes than asked
    │   ├── ObjectStoreUnavailable  it cannot be reached, timed out or answered 5xx
    │   ├── ObjectNotFound          no object with that key
    │   └── NoObjectStore           the host has none (what was asked needs one)
    └── AgentError            anything about the guest agent channel
        ├── AgentConnectionError   channel closed, handshake failed, or deadline passed
        │   └── VMExited           the sandbox's VM process is not running (it died)
        ├── GuestIncompatible      the guest agent speaks a guest protocol this host does not
        ├── AgentProtocolError     the guest sent bytes that are not a valid frame
        ├── AgentLimitError        the guest sent more than the host accepts for one operation
        └── GuestOSError           an operation failed inside the guest (errno + message)
"""

from __future__ import annotations


class HostError(Exception):
    """Base of every error the host runtime raises on purpose."""


class SetupError(HostError):
    pass


class TemplateNotFound(SetupError):
    pass


class ImageError(SetupError):
    """An OCI image could not be pulled or used (host/images/oci raises its subclasses, whose
    message starts `image <reference>:`; `image` is that reference)."""

    image: str = ""


class ImageNotFound(ImageError):
    pass


class RegistryAuthError(ImageError):
    pass


class RegistryUnavailable(ImageError):
    pass


class ImageTooLarge(ImageError):
    pass


class ImageInvalid(ImageError):
    pass


class VMMError(HostError):
    pass


class HugePagesUnavailable(VMMError):
    """The hugetlb pool had too few free pages for a VM's RAM when QEMU mapped it."""


class SnapshotFailed(VMMError):
    """A live snapshot failed; `disk_switched` says if the VM already moved to the new top,
    `no_space` that the snapshot's filesystem ran out of space (ENOSPC)."""

    def __init__(self, message: str, *, disk_switched: bool, no_space: bool = False):
        super().__init__(f"snapshot failed: {message}")
        self.disk_switched = disk_switched
        self.no_space = no_space


class SandboxNotFound(HostError):
    pass


class SnapshotNotFound(HostError):
    pass


class SandboxStateError(HostError):
    pass


class VolumeNotFound(HostError):
    pass


class VolumeInUse(HostError):
    pass


class CodeInterpreterError(HostError):
    pass


class CodeInterpreterUnavailable(CodeInterpreterError):
    pass


class CodeContextNotFound(CodeInterpreterError):
    pass


class UnsupportedLanguage(CodeInterpreterError):
    pass


class HostExhausted(HostError):
    """The host has no room for the sandbox (its capacity is taken, or it is draining); a
    pool of hosts raises it when no host took the sandbox."""


class HostMemoryExhausted(HostExhausted):
    """The host's real memory (MemAvailable, less what VM starts under way have reserved)
    would fall under its reserve with this VM started (host/memory/admission.py): refused
    before the kernel's OOM killer has to choose. The attributes are MiB."""

    def __init__(self, *, what: str, available_mb: int, reserve_mb: int, need_mb: int,
                 held_mb: int = 0, starting: int = 0, waiting: int = 0) -> None:
        under_way = f", {held_mb} MiB of it reserved by {starting} VM starts under way and " \
            f"the first commands of {waiting} new VMs" if held_mb else ""
        super().__init__(
            f"{what}: refused, the host is low on memory: {available_mb} MiB available "
            f"(MemAvailable){under_way}; this VM's start takes about {need_mb} MiB and "
            f"{reserve_mb} MiB stay in reserve (PANDASTACK_MEMORY_RESERVE_MB)")
        self.available_mb = available_mb
        self.reserve_mb = reserve_mb
        self.need_mb = need_mb


class HostUnavailable(HostError):
    """The host agent did not answer (connection refused, reset or timed out): its
    sandboxes are not lost, only out of reach until it is back."""


class HostLost(HostUnavailable):
    """The sandbox's host stopped heartbeating and was fenced: the control plane gave up on
    it, and the host kills its VMs when it comes back (a saved sandbox is woken elsewhere)."""


class ObjectStoreError(HostError):
    """The object store refused a request (credentials, bucket) or sent bytes that are not the
    object's (its content hash differs)."""


class ObjectStoreUnavailable(ObjectStoreError):
    """The object store did not answer (connection refused, timed out) or answered 5xx: what
    it holds is not lost, only out of reach until it is back."""


class ObjectNotFound(ObjectStoreError):
    """No object with that key in the store."""


class NoObjectStore(ObjectStoreError):
    """The host has no object store configured, and the operation (a volume snapshot or
    move) needs one."""


class AgentError(HostError):
    pass


class AgentConnectionError(AgentError):
    pass


class VMExited(AgentConnectionError):
    """The sandbox's VM process is not running: it died (crash, OOM kill, SIGKILL) and the
    control plane has not ended (or, persistent, stopped) the sandbox yet."""


class AgentProtocolError(AgentError):
    pass


class GuestIncompatible(AgentError):
    """The guest agent (frozen in an older or newer template, snapshot or hibernation) speaks
    a guest protocol this host does not; the message says which side to rebuild or upgrade.
    Not a connection failure: connecting again gives the same answer."""


class AgentLimitError(AgentError):
    """The guest sent more than the host accepts for one operation (a listing, a file read
    whole, a code run's results, frames queued faster than they are read): that operation
    failed and its buffers were dropped; the channel stays usable."""


class GuestOSError(AgentError):
    """An operation failed inside the guest; `errno_name` is e.g. "ENOENT", "ENOSPC"."""

    def __init__(self, errno_name: str, message: str, path: str | None = None) -> None:
        super().__init__(f"{errno_name}: {message}" + (f" ({path})" if path else ""))
        self.errno_name = errno_name
        self.message = message
        self.path = path


class BuildFailed(HostError):
    """A template build failed at a step (or at its start command or ready check). The message
    names the step and its instruction and ends with the last lines of its output; the same
    parts are attributes for callers that format their own."""

    def __init__(self, message: str, *, step: int | None = None, instruction: str = "",
                 exit_code: int | None = None, output: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.instruction = instruction
        self.exit_code = exit_code
        self.output = output
