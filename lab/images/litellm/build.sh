#!/usr/bin/env bash
# Builds the lab's LiteLLM proxy image. Usage: build.sh IMAGE_TAG BASE_IMAGE
# The base is the CPU vLLM image's debootstrap base (python3 and venv); pip's TLS trust comes
# from the machine's CA bundle.
set -euo pipefail
tag=${1:?usage: build.sh IMAGE_TAG BASE_IMAGE}
base=${2:?usage: build.sh IMAGE_TAG BASE_IMAGE}
here=$(cd "$(dirname "$0")" && pwd)
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$here"/Dockerfile "$here"/requirements.txt "$here"/constraints.txt "$context/"
cp /etc/ssl/certs/ca-certificates.crt "$context/"
docker build --quiet --build-arg BASE_IMAGE="$base" --tag "$tag" "$context" >/dev/null
echo "built $tag"
