#!/usr/bin/env bash
# Builds the lab's CPU vLLM image. Usage: build.sh IMAGE_TAG
# The base is a debootstrap rootfs (no image registry is reachable); torch comes from the
# machine's wheel directory, pip's TLS trust from the machine's CA bundle.
set -euo pipefail
tag=${1:?usage: build.sh IMAGE_TAG}
here=$(cd "$(dirname "$0")" && pwd)
mirror=${SPARKFLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
wheel_dir=${SPARKFLEET_TORCH_WHEEL_DIR:-/opt/wheels}
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT

base="$tag-base"
if ! docker image inspect "$base" >/dev/null 2>&1; then
  debootstrap --variant=minbase --include="$(paste -sd, "$here/base-packages.txt")" bookworm "$context/rootfs" "$mirror" >/dev/null
  rm -rf "$context"/rootfs/var/cache/apt/archives/*.deb "$context"/rootfs/var/lib/apt/lists/*
  tar -C "$context/rootfs" -c . | docker import - "$base" >/dev/null
  rm -rf "$context/rootfs"
fi

mkdir -p "$context/wheels"
cp "$here"/Dockerfile "$here"/requirements.txt "$here"/constraints.txt "$here"/build_tiny_model.py "$context/"
cp /etc/ssl/certs/ca-certificates.crt "$context/"
torch_wheel=$(ls "$wheel_dir"/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -n 1)
if [ -n "$torch_wheel" ]; then cp "$torch_wheel" "$context/wheels/"; fi
docker build --quiet --build-arg BASE_IMAGE="$base" --tag "$tag" "$context" >/dev/null
echo "built $tag"
