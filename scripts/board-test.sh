#!/usr/bin/env bash
# The emulated board: an arm64 Debian with systemd, edgellm's arm64 .deb, the model and a
# configuration, booted under qemu-system-aarch64 as a Raspberry Pi 4 class machine
# (-M virt -cpu cortex-a72: ARMv8.0, no dotprod), with
#   - its console (the PL011) on a unix socket the checks log in through (root autologin),
#   - a USB FTDI serial adapter (the guest's /dev/ttyUSB0) wired to a pty on this host: the PLC,
#   - user-mode networking with nothing reachable but a Mosquitto on this host's loopback
#     (restrict=on; the guest's 10.0.2.100:1883 is forwarded to it),
#   - a virtio disk with cache=writeback: the guest's flushes reach the host file, so killing
#     qemu with SIGKILL is a power cut.
# scripts/board/check.py then checks, from the host: the unit reaches active through READY=1,
# a prompt over the UART (line mode) and one over MQTT are answered, a SIGSTOPped daemon is
# restarted by the watchdog, a truncated model fails with exit 78 and is not restarted, a crash
# loop is stopped by the unit's start limit, a session survives a reboot, and N power cuts
# (default 20) while sessions are being saved: after each boot every session file passes
# `edgellm kv verify` or was moved aside, and no acknowledged answer is lost. Each stage
# prints its time.
#
# The root filesystem (mmdebstrap, ~17 min cold: the packages' configuration runs emulated)
# is cached in ${EDGELLM_CACHE:-~/.cache/edgellm}/board, outside the repo, keyed by its
# package list; the disk image is made anew each run (seconds). Run as root (chroot,
# binfmt_misc). The Debian mirror is this machine's own apt source.
# Usage: scripts/board-test.sh [--rootfs-only]     Env: EDGELLM_POWER_CUTS (default 20)
#   --rootfs-only  only make sure the cached root filesystem exists (scripts/test.sh starts this
#                  early, in the background: most of it is emulated, single-threaded dpkg work)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
stage_start=$SECONDS
stage_name=
stage() { # prints how long the stage before took, then names the next
    [ -z "$stage_name" ] || printf '=== board: took %ds: %s\n' $((SECONDS - stage_start)) "$stage_name"
    printf '=== board: %s\n' "$*"
    stage_start=$SECONDS stage_name=$*
}
die() { echo "board-test: error: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (it builds a root filesystem with chroot)"

cache="${EDGELLM_CACHE:-$HOME/.cache/edgellm}/board"
work="$repo/target/board"
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
# The packages of the board's root filesystem; a change here makes a new cached rootfs.
pkgs="systemd,systemd-sysv,udev,linux-image-arm64,e2fsprogs,kmod,procps,iproute2,passwd"
# The key: the suite, the packages and the setup hook (the initramfs's modules).
key=$( (printf '%s\n' "$suite" "$pkgs"; cat scripts/board/rootfs-setup.sh) | sha256sum | cut -c1-12)
base="$cache/rootfs-$suite-$key"

# This machine's Debian mirror (deb822 or one-line sources), never a name written here.
mirror() {
    local m
    m=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n1)
    [ -n "$m" ] || m=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list 2>/dev/null)
    [ -n "$m" ] || die "no Debian mirror in this machine's apt sources"
    echo "$m"
}

# Emulated arm64 programs in the chroot: binfmt_misc with qemu-aarch64 registered (P flag).
binfmt() {
    [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
    grep -q enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 || die "qemu-aarch64 is not enabled in binfmt_misc"
}

binfmt
if [ ! -d "$base" ]; then
    stage "root filesystem: mmdebstrap $suite arm64 (not cached yet; ~17 min)"
    mkdir -p "$cache"
    rm -rf "$base.tmp"
    mmdebstrap --quiet --arch=arm64 --variant=minbase --format=directory --include="$pkgs" \
        --setup-hook="$repo/scripts/board/rootfs-setup.sh \"\$1\"" \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --aptopt='Acquire::Languages "none"' \
        "$suite" "$base.tmp" "deb $(mirror) $suite main"
    mv "$base.tmp" "$base"
    # Older cached filesystems of other package lists are dropped.
    find "$cache" -maxdepth 1 -name 'rootfs-*' ! -path "$base" -exec rm -rf {} +
fi
stage "root filesystem: $base"
[ "${1:-}" != --rootfs-only ] || exit 0

stage "edgellm's arm64 package"
deb=$(scripts/build-deb.sh arm64)
model="${EDGELLM_MODEL_DIR:-${EDGELLM_CACHE:-$HOME/.cache/edgellm}/models}/smollm2-135m-q4_1.gguf"
[ -f "$model" ] || model=$(models/fetch.sh q4_1)

stage "disk image: the rootfs, the package installed in it, the model, the board's config"
rm -rf "$work" && mkdir -p "$work"
root="$work/root"
cp -a "$base" "$root"
cp "$deb" "$root/tmp/edgellm.deb"
chroot "$root" dpkg -i /tmp/edgellm.deb >/dev/null
rm "$root/tmp/edgellm.deb"
install -D -m 644 "$model" "$root/usr/share/edgellm/models/smollm2-135m-q4_1.gguf"
scripts/board/customize.sh "$root"
kernel=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -n1)
initrd=$(ls "$root"/boot/initrd.img-* | sort -V | tail -n1)
cp "$kernel" "$work/vmlinuz" && cp "$initrd" "$work/initrd.img"
mkfs.ext4 -q -F -L root -d "$root" "$work/disk.img" 2G
rm -rf "$root"

stage "boot and check (scripts/board/check.py)"
python3 scripts/board/check.py --work "$work" --edgellm "${EDGELLM_BIN:-target/release/edgellm}" \
    --power-cuts "${EDGELLM_POWER_CUTS:-20}"
stage "done: the emulated board passed"
