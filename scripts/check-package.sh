#!/usr/bin/env bash
# Checks the packaging without installing it on this machine:
#   1. builds the amd64 and arm64 .debs (scripts/build-deb.sh) and checks what is in them: the
#      binary for the right CPU and without test hooks, the unit, the conffile, the maintainer
#      scripts;
#   2. `systemd-analyze verify` of the unit as the package installs it, in a scratch root made
#      of the package and this machine's own units: it must print nothing at all (an unknown
#      key only prints, it does not fail);
#   3. `systemd-analyze security --offline=yes`: the unit keeps every protection an MQTT and
#      serial appliance can have (exposure at most 1.3, "OK": only the checks named in
#      $network_needs below may fail, each for the reason given there), and with the
#      serial-only drop-in it is rated SAFE.
# The arm64 package is installed for real by scripts/board-test.sh, on the emulated board.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "check-package: FAIL: $*" >&2; exit 1; }

mapfile -t debs < <(scripts/build-deb.sh amd64 arm64)
[ ${#debs[@]} -eq 2 ] || fail "expected two packages, got: ${debs[*]}"
for deb in "${debs[@]}"; do
    arch=$(dpkg-deb -f "$deb" Architecture)
    echo "check-package: $deb ($arch, $(du -h "$deb" | cut -f1))"
    list=$(dpkg-deb -c "$deb" | awk '{print $NF}')
    for f in ./usr/bin/edgellm ./usr/lib/systemd/system/edgellm.service ./etc/edgellm/edgellm.toml \
             ./usr/lib/systemd/system/edgellm-modbus.socket \
             ./usr/share/doc/edgellm/config.md ./usr/share/doc/edgellm/zh-CN/config.md \
             ./usr/share/edgellm/systemd/serial-only.conf; do
        grep -qx -- "$f" <<<"$list" || fail "$deb has no $f"
    done
    scratch=$(mktemp -d)
    dpkg-deb -x "$deb" "$scratch/root"
    dpkg-deb -e "$deb" "$scratch/control"
    want=$([ "$arch" = arm64 ] && echo "ARM aarch64" || echo "x86-64")
    file -b "$scratch/root/usr/bin/edgellm" | grep -q "$want" || fail "$deb: the binary is not $want: $(file -b "$scratch/root/usr/bin/edgellm")"
    grep -qx /etc/edgellm/edgellm.toml "$scratch/control/conffiles" || fail "$deb: edgellm.toml is not a conffile"
    grep -q 'useradd --system' "$scratch/control/postinst" || fail "$deb: the postinst makes no user"
    grep -q 'chmod 0640 "$conf"' "$scratch/control/postinst" || fail "$deb: the postinst does not make the configuration 0640"
    grep -q 'deb-systemd-helper enable edgellm.service' "$scratch/control/postinst" || fail "$deb: the postinst does not enable the unit"
    cmp -s "$scratch/root/usr/lib/systemd/system/edgellm.service" board/systemd/edgellm.service || fail "$deb: the unit differs from board/systemd/edgellm.service"
    scripts/check-no-test-hooks.sh "$scratch/root/usr/bin/edgellm" >/dev/null || fail "$deb: the binary has test hooks"
    rm -rf "$scratch"
done

# 2. verify: the package's files on top of this machine's units and /bin/kill (ExecReload).
amd64=$(printf '%s\n' "${debs[@]}" | grep _amd64.deb)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/lib/systemd/system" "$root/bin"
cp -a /lib/systemd/system/. "$root/lib/systemd/system/"
cp /bin/kill "$root/bin/"
dpkg-deb -x "$amd64" "$root"
out=$(systemd-analyze verify --root="$root" edgellm.service edgellm-modbus.socket 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify printed (it must print nothing): $out"
echo "check-package: systemd-analyze verify edgellm.service edgellm-modbus.socket: clean"

# 3. security. What an MQTT + serial appliance cannot give up, and why:
network_needs=(
    "PrivateNetwork="                          # it is an MQTT client and a Modbus TCP server
    "RestrictAddressFamilies=~AF_(INET|INET6)" # the same
    "IPAddressDeny="                           # allowed: loopback, link-local, private ranges
    "RestrictAddressFamilies=~AF_UNIX"         # sd_notify's socket
    "PrivateDevices="                          # the serial ports (a private /dev has none)
    "DeviceAllow="                             # the tty classes of the UARTs and USB adapters
    "SystemCallFilter=~@resources"             # sched_setaffinity: a board's big cores
    "RootDirectory=/RootImage="                # it runs from the host's root file system
)
rating() { # ROOT -> "exposure rating" of edgellm.service
    systemd-analyze security --offline=yes --root="$1" edgellm.service 2>&1 |
        sed -n 's/.*Overall exposure level for edgellm.service: \([0-9.]*\) \([A-Z]*\).*/\1 \2/p'
}
failing=$(systemd-analyze security --offline=yes --root="$root" edgellm.service 2>&1 | sed -n 's/^✗ \([^ ]*\) .*/\1/p')
while read -r check; do
    [ -n "$check" ] || continue
    printf '%s\n' "${network_needs[@]}" | grep -qxF -- "$check" || fail "systemd-analyze security: $check is not set (only ${network_needs[*]} may be missing)"
done <<<"$failing"
read -r exposure level <<<"$(rating "$root")"
awk -v e="$exposure" 'BEGIN { exit !(e <= 1.3) }' || fail "exposure $exposure $level (at most 1.3)"
echo "check-package: systemd-analyze security edgellm.service: $exposure $level (failing only: $(echo $failing))"
mkdir -p "$root/etc/systemd/system/edgellm.service.d"
cp board/systemd/serial-only.conf "$root/etc/systemd/system/edgellm.service.d/"
read -r exposure level <<<"$(rating "$root")"
[ "$level" = SAFE ] || [ "$level" = PERFECT ] || fail "with serial-only.conf: $exposure $level (SAFE or better wanted)"
echo "check-package: systemd-analyze security with serial-only.conf: $exposure $level"
