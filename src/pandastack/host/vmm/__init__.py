"""Virtual machine monitors: the driver protocol, QEMU, accelerators, qcow2 disks."""
