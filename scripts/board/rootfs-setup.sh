#!/bin/sh
# mmdebstrap's setup hook for the emulated board's root filesystem ($1), run before any package
# is installed: the initramfs will hold only the modules the board boots from (virtio disk,
# ext4), not mkinitramfs's default of most modules, which costs many minutes of emulated work.
set -eu
mkdir -p "$1/etc/initramfs-tools/conf.d"
echo MODULES=list >"$1/etc/initramfs-tools/conf.d/edgellm-board.conf"
printf '%s\n' virtio_pci virtio_blk virtio_net ext4 crc32c_generic >"$1/etc/initramfs-tools/modules"
