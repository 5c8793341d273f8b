"""Virtual machine monitors: the driver protocol and the capabilities a driver declares
(driver.py), drivers by name (factory.py), one folder per driver (qemu/; the tests' fake is
tests/host/fake_vmm.py), and what every driver's VMs share on the host: their cgroups
(cgroups.py) and how the host treats the memory they free (host_memory.py)."""
