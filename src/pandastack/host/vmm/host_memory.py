"""What this host does with the memory its VMs free: whether it is itself a VM whose
hypervisor takes freed pages back (which makes fresh huge pages slow to touch). A fact of the
host, whatever the VMM: the runtime's machinery and the QEMU driver's settings ask it."""

from __future__ import annotations

from pathlib import Path

VIRTIO_BALLOON_DEVICE = "0x0005"
VIRTIO_BALLOON_F_REPORTING = 5


def reports_free_pages(devices: Path = Path("/sys/bus/virtio/devices")) -> bool:
    """Whether this host is itself a VM that hands the memory it frees back to its hypervisor
    (virtio-balloon free page reporting). There, a 2 MiB page taken again after that is slow
    to touch: a fork's child loading its 294 MiB stream into transparent huge pages took
    1033 ms at p50 (424-1092), into 4 KiB pages 449 ms (439-484), n=10 each, interleaved."""
    for device in devices.glob("*"):
        try:
            if (device / "device").read_text().strip() != VIRTIO_BALLOON_DEVICE:
                continue
            features = (device / "features").read_text().strip()
        except OSError:
            continue
        if features[VIRTIO_BALLOON_F_REPORTING:VIRTIO_BALLOON_F_REPORTING + 1] == "1":
            return True
    return False
