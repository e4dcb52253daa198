# Shared set-up for scripts/lab and scripts/test: installs what a fresh Debian machine
# lacks, starts dockerd when nothing runs it, and prepares the Python venv, the
# collection path and the lab host image. Sourced, never run.
# shellcheck shell=bash

SPARKFLEET_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SPARKFLEET_CACHE=${SPARKFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sparkfleet}
# Debian's docker client talks to Debian's 20.10 engine; another, newer client may sit
# earlier on PATH, so tools get this one first through the venv's bin directory.
SPARKFLEET_DOCKER_CLIENT=/usr/bin/docker
SPARKFLEET_SYSTEM_PACKAGES=(docker.io debootstrap python3-venv rsync git)

log() { printf '==> %s\n' "$*" >&2; }

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

ensure_system_packages() {
  local missing=()
  local pkg
  for pkg in "${SPARKFLEET_SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null | grep -qx installed || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

docker_ready() { "$SPARKFLEET_DOCKER_CLIENT" info >/dev/null 2>&1; }

ensure_dockerd() {
  docker_ready && return 0
  if [ "$(ps -o comm= -p 1)" = systemd ]; then
    log "starting docker.service"
    sudo_if_needed systemctl start docker
  else
    log "starting dockerd (no systemd on this machine), log in $SPARKFLEET_CACHE/dockerd.log"
    mkdir -p "$SPARKFLEET_CACHE"
    sudo_if_needed sh -c "nohup /usr/sbin/dockerd >'$SPARKFLEET_CACHE/dockerd.log' 2>&1 &"
  fi
  local waited=0
  until docker_ready; do
    [ $waited -ge 60 ] && { log "dockerd did not come up; see $SPARKFLEET_CACHE/dockerd.log"; return 1; }
    sleep 1; waited=$((waited + 1))
  done
}

requirements_hash() {
  cat "$SPARKFLEET_ROOT/requirements-dev.txt" "$SPARKFLEET_ROOT/constraints-dev.txt" | sha256sum | cut -c1-12
}

ensure_venv() {
  SPARKFLEET_VENV="$SPARKFLEET_CACHE/venv-$(requirements_hash)"
  if [ ! -x "$SPARKFLEET_VENV/bin/ansible-playbook" ]; then
    log "creating the Python venv $SPARKFLEET_VENV"
    rm -rf "$SPARKFLEET_VENV"
    python3 -m venv "$SPARKFLEET_VENV"
    "$SPARKFLEET_VENV/bin/pip" install --quiet --disable-pip-version-check \
      -r "$SPARKFLEET_ROOT/requirements-dev.txt" -c "$SPARKFLEET_ROOT/constraints-dev.txt"
  fi
  ln -sfn "$SPARKFLEET_DOCKER_CLIENT" "$SPARKFLEET_VENV/bin/docker"
  export PATH="$SPARKFLEET_VENV/bin:$PATH"
  export VIRTUAL_ENV="$SPARKFLEET_VENV"
}

# ansible-test and molecule want the collection under ansible_collections/<ns>/<name>.
ensure_collection_path() {
  local tree="$SPARKFLEET_ROOT/.cache/collections"
  mkdir -p "$tree/ansible_collections/sparkfleet"
  ln -sfn ../../../.. "$tree/ansible_collections/sparkfleet/vllm"
  export ANSIBLE_COLLECTIONS_PATH="$tree"
}

ensure_ansible_test_bootstrap() {
  local pip_version
  pip_version=$(sed -n "s/^ *pip='\([0-9.]*\)',/\1/p" \
    "$SPARKFLEET_VENV"/lib/python3*/site-packages/ansible_test/_internal/python_requirements.py)
  mkdir -p "$HOME/.ansible/test/cache"
  cp "$SPARKFLEET_ROOT/scripts/lib/get_pip_standin.py" "$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
}

lab_image_tag() {
  echo "sparkfleet-lab-host:$(cat "$SPARKFLEET_ROOT"/lab/images/host/* | sha256sum | cut -c1-12)"
}

# Rebuilt only when its recipe changes: the tag is the recipe's hash.
ensure_lab_image() {
  SPARKFLEET_LAB_IMAGE=$(lab_image_tag)
  export SPARKFLEET_LAB_IMAGE
  if ! "$SPARKFLEET_DOCKER_CLIENT" image inspect "$SPARKFLEET_LAB_IMAGE" >/dev/null 2>&1; then
    log "building lab host image $SPARKFLEET_LAB_IMAGE (debootstrap, about a minute)"
    PATH="$(dirname "$SPARKFLEET_DOCKER_CLIENT"):$PATH" sudo_if_needed "$SPARKFLEET_ROOT/lab/images/host/build.sh" "$SPARKFLEET_LAB_IMAGE"
  fi
}

ensure_all() {
  ensure_system_packages
  ensure_dockerd
  ensure_venv
  ensure_collection_path
  ensure_lab_image
}
