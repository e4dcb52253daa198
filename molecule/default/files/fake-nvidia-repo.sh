#!/bin/sh
# Builds small .deb packages named like the NVIDIA driver packages (580 and 590 branches)
# and a local apt repository, so the driver guard runs against real apt and dpkg. The real
# driver cannot exist here (no GPU); nvidia-utils ships an nvidia-smi that prints output
# recorded from a DGX Spark, and says so.
set -eu
repo=/srv/fake-nvidia
mkdir -p "$repo"

mkdeb() {
  name=$1 version=$2 depends=$3 replaces=${4:-}
  root=$(mktemp -d)
  mkdir -p "$root/DEBIAN"
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: all"
    echo "Maintainer: sparkfleet lab <lab@sparkfleet.invalid>"
    [ -n "$depends" ] && echo "Depends: $depends"
    [ -n "$replaces" ] && echo "Conflicts: $replaces" && echo "Replaces: $replaces"
    echo "Description: lab stand-in for $name (sparkfleet.vllm tests)"
  } > "$root/DEBIAN/control"
  case "$name" in
    nvidia-utils-*)
      branch_version=${version%%-*}
      mkdir -p "$root/usr/bin"
      printf '#!/bin/sh\n# Recorded output of nvidia-smi --query-gpu=driver_version --format=csv,noheader on a DGX Spark.\necho %s\n' \
        "$branch_version" > "$root/usr/bin/nvidia-smi"
      chmod 0755 "$root/usr/bin/nvidia-smi"
      ;;
  esac
  dpkg-deb --root-owner-group --build "$root" "$repo/${name}_${version}_all.deb" >/dev/null
  rm -rf "$root"
}

# One branch replaces the other, as Ubuntu's driver packages do.
mkdeb libnvidia-compute-580 580.95.05-0ubuntu1 ""
mkdeb nvidia-utils-580 580.95.05-0ubuntu1 ""
mkdeb nvidia-driver-580-open 580.95.05-0ubuntu1 "libnvidia-compute-580, nvidia-utils-580"
mkdeb libnvidia-compute-590 590.44.01-0ubuntu1 ""
mkdeb nvidia-utils-590 590.44.01-0ubuntu1 "" nvidia-utils-580
mkdeb nvidia-driver-590-open 590.44.01-0ubuntu1 "libnvidia-compute-590, nvidia-utils-590" nvidia-driver-580-open
# The proprietary flavour's kernel modules of the 580 branch, which a GB10 cannot initialise.
mkdeb nvidia-dkms-580 580.95.05-0ubuntu1 ""
# Kernel-side modules of the 590 branch conflict with nothing, so holds alone do not stop
# a meta package from pulling them in; only the upgrade simulation does.
mkdeb linux-modules-nvidia-590-open-6.17.0-1021-nvidia 6.17.0-1021.21 ""
# The meta package a DGX OS image installs; its next version is what would pull 590 in.
mkdeb dgx-gpu-stack 1.0 "nvidia-driver-580-open"

cd "$repo" && apt-ftparchive packages . > Packages
echo "deb [trusted=yes] file:$repo ./" > /etc/apt/sources.list.d/fake-nvidia.list
