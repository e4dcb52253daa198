# Shared set-up for scripts/lab and scripts/test: installs what a fresh Debian machine
# lacks, starts dockerd when nothing runs it, and prepares the Python venv, the
# collection path and the lab host image. Sourced, never run.
# shellcheck shell=bash

SPARKFLEET_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SPARKFLEET_CACHE=${SPARKFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sparkfleet}
# Debian's docker client talks to Debian's 20.10 engine; another, newer client may sit
# earlier on PATH, so tools get this one first through the venv's bin directory.
SPARKFLEET_DOCKER_CLIENT=/usr/bin/docker
# unzip: the serving_host role unpacks py-spy's wheel on the controller (ansible.builtin.unarchive).
SPARKFLEET_SYSTEM_PACKAGES=(docker.io debootstrap python3-venv rsync git docker-registry curl unzip)

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
  # One docker exec per task instead of copying each module in first: a site.yml run on the lab
  # cluster's two hosts took 58 s instead of 96 s (no change either way).
  export ANSIBLE_PIPELINING=True
  # community.docker's API read timeout (60 s by default): removing a lab host with its inner
  # Docker volume took longer than that on two cores busy with the other lanes, failing a
  # scenario whose tests had passed.
  export DOCKER_TIMEOUT=300
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
    remove_other_tags sparkfleet-lab-host "$SPARKFLEET_LAB_IMAGE"
  fi
}

# Images of an older recipe are of no more use once the current one is built.
remove_other_tags() {
  local repository=$1 keep=$2 image
  for image in $("$SPARKFLEET_DOCKER_CLIENT" image ls --format '{{.Repository}}:{{.Tag}}' "$repository"); do
    case "$image" in "$keep"|"$keep"-base) ;; *) "$SPARKFLEET_DOCKER_CLIENT" rmi "$image" >/dev/null 2>&1 || true ;; esac
  done
}

docker_gateway() {
  ip -4 -o addr show docker0 | awk '{split($4, a, "/"); print a[1]}'
}

registry_running() { curl -fsS "http://$1:5000/v2/" >/dev/null 2>&1; }

# Debian's docker-registry, serving one storage directory on loopback (where this machine's
# dockerd pushes) and on the docker0 gateway (where the lab hosts' dockerd pull), and on no
# other interface. The processes are recorded by PID.
ensure_registry() {
  local address config
  mkdir -p "$SPARKFLEET_CACHE/registry/storage"
  for address in 127.0.0.1 "$(docker_gateway)"; do
    registry_running "$address" && continue
    config="$SPARKFLEET_CACHE/registry/config-$address.yml"
    cat > "$config" <<CONFIG
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $SPARKFLEET_CACHE/registry/storage
  delete:
    enabled: true
http:
  addr: $address:5000
CONFIG
    log "starting the lab registry on $address:5000"
    nohup /usr/bin/docker-registry serve "$config" >"$SPARKFLEET_CACHE/registry/$address.log" 2>&1 &
    echo $! > "$SPARKFLEET_CACHE/registry/$address.pid"
    local waited=0
    until registry_running "$address"; do
      [ $waited -ge 30 ] && { log "the registry on $address did not come up; see $SPARKFLEET_CACHE/registry/$address.log"; return 1; }
      sleep 1; waited=$((waited + 1))
    done
  done
}

stop_registry() {
  local pid_file pid
  for pid_file in "$SPARKFLEET_CACHE"/registry/*.pid; do
    [ -f "$pid_file" ] || continue
    pid=$(cat "$pid_file")
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q docker-registry; then
      kill "$pid"
    fi
    rm -f "$pid_file"
  done
}

# The CPU vLLM image, pushed to the lab registry so it has a real repo@sha256 digest.
ensure_vllm_image() {
  local recipe_hash local_tag pushed
  recipe_hash=$(cat "$SPARKFLEET_ROOT"/lab/images/vllm-cpu/* | sha256sum | cut -c1-12)
  local_tag="127.0.0.1:5000/sparkfleet/vllm-cpu:$recipe_hash"
  if ! "$SPARKFLEET_DOCKER_CLIENT" image inspect "$local_tag" >/dev/null 2>&1; then
    log "building the CPU vLLM image $local_tag (several minutes the first time)"
    PATH="$(dirname "$SPARKFLEET_DOCKER_CLIENT"):$PATH" sudo_if_needed "$SPARKFLEET_ROOT/lab/images/vllm-cpu/build.sh" "$local_tag"
    remove_other_tags 127.0.0.1:5000/sparkfleet/vllm-cpu "$local_tag"
  fi
  "$SPARKFLEET_DOCKER_CLIENT" push --quiet "$local_tag" >/dev/null
  pushed=$("$SPARKFLEET_DOCKER_CLIENT" image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$local_tag" |
    grep "^127.0.0.1:5000/sparkfleet/vllm-cpu@" | head -n 1)
  export SPARKFLEET_VLLM_IMAGE_LOCAL="$local_tag"
  export SPARKFLEET_VLLM_IMAGE="$(docker_gateway):5000/sparkfleet/vllm-cpu:$recipe_hash@${pushed#*@}"
  export SPARKFLEET_REGISTRY="$(docker_gateway):5000"
}

# The lab gateway's LiteLLM proxy image, built on the CPU vLLM image's debootstrap base and
# pushed to the lab registry like it, so the gateway role pins it by digest.
ensure_litellm_image() {
  local recipe_hash local_tag pushed
  recipe_hash=$(cat "$SPARKFLEET_ROOT"/lab/images/litellm/* "$SPARKFLEET_ROOT"/lab/images/vllm-cpu/* | sha256sum | cut -c1-12)
  local_tag="127.0.0.1:5000/sparkfleet/litellm:$recipe_hash"
  if ! "$SPARKFLEET_DOCKER_CLIENT" image inspect "$local_tag" >/dev/null 2>&1; then
    log "building the LiteLLM proxy image $local_tag (a few minutes the first time)"
    PATH="$(dirname "$SPARKFLEET_DOCKER_CLIENT"):$PATH" sudo_if_needed "$SPARKFLEET_ROOT/lab/images/litellm/build.sh" \
      "$local_tag" "$SPARKFLEET_VLLM_IMAGE_LOCAL-base"
    remove_other_tags 127.0.0.1:5000/sparkfleet/litellm "$local_tag"
  fi
  "$SPARKFLEET_DOCKER_CLIENT" push --quiet "$local_tag" >/dev/null
  pushed=$("$SPARKFLEET_DOCKER_CLIENT" image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$local_tag" |
    grep "^127.0.0.1:5000/sparkfleet/litellm@" | head -n 1)
  export SPARKFLEET_LITELLM_IMAGE="$(docker_gateway):5000/sparkfleet/litellm:$recipe_hash@${pushed#*@}"
}

# The tiny generation model, built once with the vLLM image's own torch and transformers, and
# a variant with other weights (a different model for the correctness diff to tell apart).
ensure_tiny_model() {
  export SPARKFLEET_TINY_MODEL="$SPARKFLEET_CACHE/models/tiny-llama"
  export SPARKFLEET_TINY_VARIANT="$SPARKFLEET_CACHE/models/tiny-llama-variant"
  if [ ! -f "$SPARKFLEET_TINY_MODEL/model.safetensors" ]; then
    log "building the tiny lab model into $SPARKFLEET_TINY_MODEL"
    mkdir -p "$SPARKFLEET_TINY_MODEL"
    "$SPARKFLEET_DOCKER_CLIENT" run --rm --volume "$SPARKFLEET_TINY_MODEL:/out" --entrypoint python \
      "$SPARKFLEET_VLLM_IMAGE_LOCAL" /opt/sparkfleet/build_tiny_model.py /out >/dev/null 2>&1
    chmod 0644 "$SPARKFLEET_TINY_MODEL"/*
  fi
  if [ ! -f "$SPARKFLEET_TINY_VARIANT/model.safetensors" ]; then
    log "deriving the tiny variant model into $SPARKFLEET_TINY_VARIANT"
    mkdir -p "$SPARKFLEET_TINY_VARIANT"
    "$SPARKFLEET_DOCKER_CLIENT" run --rm --volume "$SPARKFLEET_TINY_MODEL:/source:ro" \
      --volume "$SPARKFLEET_TINY_VARIANT:/out" --volume "$SPARKFLEET_ROOT/lab/models:/recipes:ro" \
      --entrypoint python "$SPARKFLEET_VLLM_IMAGE_LOCAL" /recipes/tiny_variant.py /source /out 1 >/dev/null 2>&1
    chmod 0644 "$SPARKFLEET_TINY_VARIANT"/*
  fi
}

# The lab endpoints' API key and the gateway's master key: generated here, never in git, readable by root only.
ensure_lab_api_key() {
  local key_file="$SPARKFLEET_ROOT/.cache/lab/api-key"
  if [ ! -s "$key_file" ]; then
    mkdir -p "$(dirname "$key_file")"
    (umask 077 && python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > "$key_file")
  fi
  SPARKFLEET_LAB_API_KEY=$(cat "$key_file")
  export SPARKFLEET_LAB_API_KEY
  # The lab gateway's master key, in LiteLLM's sk- form.
  key_file="$SPARKFLEET_ROOT/.cache/lab/gateway-key"
  if [ ! -s "$key_file" ]; then
    (umask 077 && python3 -c 'import secrets; print("sk-" + secrets.token_urlsafe(32))' > "$key_file")
  fi
  SPARKFLEET_LAB_GATEWAY_KEY=$(cat "$key_file")
  export SPARKFLEET_LAB_GATEWAY_KEY
}

ensure_all() {
  ensure_system_packages
  ensure_dockerd
  ensure_venv
  ensure_collection_path
  ensure_lab_image
}

# The network the lab hosts share (Docker's default bridge): the lab cluster's fast link.
export_lab_subnet() {
  SPARKFLEET_LAB_SUBNET=$("$SPARKFLEET_DOCKER_CLIENT" network inspect bridge --format '{{(index .IPAM.Config 0).Subnet}}')
  export SPARKFLEET_LAB_SUBNET
}

# The lab's environment as shell exports, each value quoted for the shell; the keys as reads of their 0600 files, so
# they never reach the terminal.
print_lab_environment() {
  local name
  printf '# The sparkfleet lab environment (scripts/lab env); eval "$(scripts/lab env)" to use it in this shell.\n'
  printf 'export PATH=%q:"$PATH"\n' "$SPARKFLEET_VENV/bin"
  for name in VIRTUAL_ENV ANSIBLE_COLLECTIONS_PATH ANSIBLE_PIPELINING DOCKER_TIMEOUT SPARKFLEET_VLLM_IMAGE \
      SPARKFLEET_VLLM_IMAGE_LOCAL SPARKFLEET_LITELLM_IMAGE SPARKFLEET_REGISTRY SPARKFLEET_TINY_MODEL \
      SPARKFLEET_TINY_VARIANT SPARKFLEET_LAB_SUBNET; do
    printf 'export %s=%q\n' "$name" "${!name}"
  done
  printf 'export SPARKFLEET_LAB_API_KEY="$(cat %q)"\n' "$SPARKFLEET_ROOT/.cache/lab/api-key"
  printf 'export SPARKFLEET_LAB_GATEWAY_KEY="$(cat %q)"\n' "$SPARKFLEET_ROOT/.cache/lab/gateway-key"
}

# py-spy's pinned wheel for this machine, fetched once at set-up into the folder the vllm role's default
# vllm_py_spy_cache names, so the lab's runs find it there and send nothing past this machine.
ensure_py_spy_wheel() {
  local wheel url sha256 folder="$HOME/.cache/sparkfleet/py-spy"
  wheel=$("$SPARKFLEET_VENV/bin/python" -c 'import sys, yaml
wheel = yaml.safe_load(open(sys.argv[1]))["vllm_py_spy_wheels"][sys.argv[2]]
print(wheel["url"], wheel["sha256"])' "$SPARKFLEET_ROOT/roles/vllm/defaults/main.yml" "$(uname -m)")
  read -r url sha256 <<< "$wheel"
  if [ ! -f "$folder/${url##*/}" ]; then
    log "fetching py-spy's pinned wheel into $folder"
    mkdir -p "$folder"
    curl -fsSL --retry 3 -o "$folder/.download" "$url"
    echo "$sha256  $folder/.download" | sha256sum --check --quiet
    mv "$folder/.download" "$folder/${url##*/}"
  fi
}

ensure_serving_lab() {
  ensure_py_spy_wheel
  ensure_registry
  ensure_vllm_image
  ensure_litellm_image
  ensure_tiny_model
  ensure_lab_api_key
  export_lab_subnet
}
