#!/bin/sh
# pandastack guest PID 1 (dash). Mounts the basic filesystems and keeps the guest agent running.
# It runs the agent in the foreground: while dash waits for it, it also reaps orphaned zombies
# that the kernel reparents to PID 1. Keep it that way (no `exec`, no background agent).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=linux
umask 022

say() { echo "pandastack-init: $*" > /dev/console; }

mounted() { mountpoint -q "$1" 2>/dev/null; }

mounted /proc || mount -t proc -o nosuid,nodev,noexec proc /proc
mounted /sys || mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
mounted /dev || mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev
exec </dev/null >/dev/console 2>&1

mkdir -p /dev/pts /dev/shm
mounted /dev/pts || mount -t devpts -o nosuid,noexec,gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts
mounted /dev/shm || mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /dev/shm
mounted /run || mount -t tmpfs -o nosuid,nodev,mode=0755,size=20% tmpfs /run
# favordynmods: a process entering its exec's cgroup leaf need not wait for an RCU grace
# period (4-7 ms of a first exec under TCG, docs/benchmarks-floor.md); kernels before 6.0
# refuse the option, and get the mount without it.
mounted /sys/fs/cgroup || mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate,favordynmods cgroup2 /sys/fs/cgroup 2>/dev/null \
  || mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate cgroup2 /sys/fs/cgroup
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
[ -e /dev/stdin ] || ln -s /proc/self/fd/0 /dev/stdin
[ -e /dev/stdout ] || ln -s /proc/self/fd/1 /dev/stdout
[ -e /dev/stderr ] || ln -s /proc/self/fd/2 /dev/stderr
mkdir -p /run/lock /run/user /run/pandastack
# /etc/machine-id points here; the agent rewrites it on every restore.
[ -e /run/pandastack/machine-id ] || : > /run/pandastack/machine-id
chmod 1777 /tmp 2>/dev/null

echo pandastack > /proc/sys/kernel/hostname  # /etc/hostname links here
ip link set lo up || say "cannot bring up lo"
# Every sandbox has the same guest address; the host maps it per sandbox outside the guest.
if [ -e /sys/class/net/eth0 ]; then
	# The sandbox network is IPv4 only (a /30, NAT and the egress policy); IPv6 on eth0
	# would only send router solicitations and neighbour discovery, and a clone restored
	# within seconds of the template's boot sends the ones still due.
	v6=/proc/sys/net/ipv6/conf/eth0/disable_ipv6
	[ -w "$v6" ] && echo 1 > "$v6"
	{ ip link set eth0 up && ip addr add 169.254.0.21/30 dev eth0 \
		&& ip route add default via 169.254.0.22; } || say "cannot configure eth0"
fi

# The agent runs in a cgroup of its own from its first instruction, so the pages Python loads
# are charged there and reclaimed last when user processes fill memory (the agent sets the
# limits: guest/cgroups.py).
cg=/sys/fs/cgroup
{ echo "+cpu +memory +pids" > $cg/cgroup.subtree_control && mkdir -p $cg/agent; } \
	|| say "cannot create the agent's cgroup"

cd /opt/pandastack || say "no /opt/pandastack"
while :; do
	echo "pandastack-init: starting agent" > /dev/console
	sh -c 'echo $$ > /sys/fs/cgroup/agent/cgroup.procs; exec python3 -m pandastack_guest --guest'
	say "agent exited with status $?; restarting in 0.5 s"
	sleep 0.5
done
