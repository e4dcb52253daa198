#!/usr/bin/env bash
# Builds the lab host image (a Debian bookworm rootfs that boots systemd as PID 1) from
# debootstrap, because no image registry is reachable. Usage: build.sh IMAGE_TAG
set -euo pipefail
tag=${1:?usage: build.sh IMAGE_TAG}
here=$(cd "$(dirname "$0")" && pwd)
mirror=${SPARKFLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT

debootstrap --variant=minbase --include="$(paste -sd, "$here/packages.txt")" \
  bookworm "$rootfs" "$mirror" >/dev/null
# A fresh machine-id per container comes from systemd on first boot.
: > "$rootfs/etc/machine-id"
# Units that make no sense in a container and slow its boot.
for unit in getty@tty1.service systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer; do
  chroot "$rootfs" systemctl mask "$unit" >/dev/null 2>&1 || true
done
# Fleet hosts run a network stack whose wait-online unit the wait_online role enables.
# networkd keeps the address Docker gives eth0, so network-online.target is reached once
# the address exists, as on a host that got it from DHCP.
chroot "$rootfs" systemctl enable systemd-networkd.service >/dev/null 2>&1
printf '[Match]\nName=eth0\n\n[Network]\nDHCP=no\nLinkLocalAddressing=no\nIPv6AcceptRA=no\nKeepConfiguration=yes\n' \
  > "$rootfs/etc/systemd/network/80-lab.network"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*

tar -C "$rootfs" -c . | docker import - "$tag-rootfs" >/dev/null
# docker import cannot set a stop signal; systemd ignores SIGTERM and wants SIGRTMIN+3.
printf 'FROM %s\nENV container=docker\nSTOPSIGNAL SIGRTMIN+3\nCMD ["/lib/systemd/systemd"]\n' "$tag-rootfs" |
  docker build --quiet --tag "$tag" - >/dev/null
docker rmi "$tag-rootfs" >/dev/null
echo "built $tag"
