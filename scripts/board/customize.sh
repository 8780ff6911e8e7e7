#!/usr/bin/env bash
# Makes a root filesystem (with edgellm's package installed) into the emulated board:
# the disk in fstab, a host name, DHCP on the virtio NIC, root logged in on the console (the
# checks drive it), edgellm's configuration for the board (the host's broker through the
# forwarded 10.0.2.100:1883, the PLC on the USB serial adapter in line mode), and the timers
# that would only slow the boots down masked. Usage: scripts/board/customize.sh ROOT
set -euo pipefail
root=$1
[ -x "$root/usr/bin/edgellm" ] || { echo "customize: $root has no /usr/bin/edgellm" >&2; exit 1; }

echo edgellm-board >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 edgellm-board\n' >"$root/etc/hosts"
echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' >"$root/etc/fstab"

mkdir -p "$root/etc/systemd/network"
printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n' >"$root/etc/systemd/network/10-wired.network"
ln -sf /lib/systemd/system/systemd-networkd.service "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"

# Root on the console without a password: the board is reachable only through this socket.
mkdir -p "$root/etc/systemd/system/serial-getty@ttyAMA0.service.d"
cat >"$root/etc/systemd/system/serial-getty@ttyAMA0.service.d/autologin.conf" <<'UNIT'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --noclear --keep-baud 115200 - vt100
UNIT
# A quiet, plain shell for the checks: no prompt decorations, no colours, no pager.
cat >"$root/root/.profile" <<'SH'
export PS1='board# ' TERM=dumb SYSTEMD_PAGER= SYSTEMD_COLORS=0 PAGER=cat
stty -echo 2>/dev/null
SH

for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
            e2scrub_reap.service getty@tty1.service getty-static.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
done

cat >"$root/etc/edgellm/edgellm.toml" <<'TOML'
# The emulated board's configuration (scripts/board/customize.sh).
[model]
path = "/usr/share/edgellm/models/smollm2-135m-q4_1.gguf"
# A short context keeps the session files small, so that the power cuts land in saves.
ctx = 512

[state]
dir = "/var/lib/edgellm"

[mqtt]
broker = "10.0.2.100:1883"
device = "board"

[[serial]]
path = "/dev/ttyUSB0"
baud = 115200
mode = "line"
TOML
