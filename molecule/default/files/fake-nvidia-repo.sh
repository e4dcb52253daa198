#!/bin/sh
# Builds small .deb packages named like the NVIDIA driver packages (580 and 590 branches)
# and a local apt repository, so the driver guard runs against real apt and dpkg. The real
# driver cannot exist here (no GPU); nvidia-utils ships an nvidia-smi that prints output
# recorded from a DGX Spark, and says so.
set -eu
repo=/srv/fake-nvidia
mkdir -p "$repo"

mkdeb() {
  name=$1 version=$2 depends=$3
  root=$(mktemp -d)
  mkdir -p "$root/DEBIAN"
  {
    echo "Package: $name"
    echo "Version: $version"
    echo "Architecture: all"
    echo "Maintainer: sparkfleet lab <lab@sparkfleet.invalid>"
    [ -n "$depends" ] && echo "Depends: $depends"
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

for branch_version in 580.95.05 590.44.01; do
  branch=${branch_version%%.*}
  mkdeb "libnvidia-compute-$branch" "$branch_version-0ubuntu1" ""
  mkdeb "nvidia-utils-$branch" "$branch_version-0ubuntu1" ""
  mkdeb "nvidia-driver-$branch-open" "$branch_version-0ubuntu1" "libnvidia-compute-$branch, nvidia-utils-$branch"
done
# The meta package a DGX OS image installs; its next version is what would pull 590 in.
mkdeb dgx-gpu-stack 1.0 "nvidia-driver-580-open"

cd "$repo" && apt-ftparchive packages . > Packages
echo "deb [trusted=yes] file:$repo ./" > /etc/apt/sources.list.d/fake-nvidia.list
