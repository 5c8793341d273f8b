"""Virtual machine monitors: the driver protocol (driver.py), drivers by name (factory.py),
the QEMU driver (qemu.py, its disks in qemu_disk.py and qcow2.py, QMP in qmp.py) and what the
host offers VMs (accel.py)."""
