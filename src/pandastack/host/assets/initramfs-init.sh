#!/bin/sh
# pandastack initramfs /init (busybox sh). Loads the virtio + ext4 modules, mounts the root disk
# and hands over to /sbin/pandastack-init. Kernel cmdline:
#   root=/dev/vda            root block device (default /dev/vda), mounted ext4 rw,noatime
#   pandastack.probe=1       print PANDASTACK_PROBE_OK and power off without touching the disk
# Any failure prints one "PANDASTACK_INIT_ERROR: ..." line on the console and powers off.
/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/sbin:/bin:/usr/sbin:/usr/bin

fail() {
	echo "PANDASTACK_INIT_ERROR: $*" > /dev/console
	sync
	poweroff -f
	sleep 5
	exit 1
}

mount -t proc -o nosuid,nodev,noexec proc /proc || fail "cannot mount /proc"
mount -t sysfs -o nosuid,nodev,noexec sysfs /sys || fail "cannot mount /sys"
mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev || fail "cannot mount devtmpfs on /dev"

root=/dev/vda
for arg in $(cat /proc/cmdline); do
	case "$arg" in
		pandastack.probe=1)
			echo "PANDASTACK_PROBE_OK" > /dev/console
			poweroff -f
			sleep 5
			exit 0
			;;
		root=*) root="${arg#root=}" ;;
	esac
done

while read -r ko; do
	[ -n "$ko" ] || continue
	insmod "/lib/modules/$ko" || fail "insmod $ko failed"
done < /etc/pandastack-modules

i=0
while [ ! -b "$root" ]; do
	i=$((i + 1))
	[ "$i" -le 100 ] || fail "root device $root did not appear within 5 s"
	sleep 0.05
done

# noatime: a clone's clock is set forward by the template's age, so with relatime every file
# it reads for the first time (all of them, once a template is a day old) would dirty an inode
# and cost the clone a journal commit and writes into its own disk layer.
mount -t ext4 -o rw,noatime "$root" /newroot || fail "cannot mount $root (ext4) on /newroot"
[ -x /newroot/sbin/pandastack-init ] || fail "$root has no executable /sbin/pandastack-init"

for m in dev proc sys; do
	mkdir -p "/newroot/$m"
	mount --move "/$m" "/newroot/$m" || fail "cannot move /$m into the new root"
done

exec switch_root /newroot /sbin/pandastack-init
echo "PANDASTACK_INIT_ERROR: switch_root to $root failed" > /newroot/dev/console
poweroff -f
