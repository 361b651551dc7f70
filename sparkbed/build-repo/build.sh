#!/bin/bash
# The bed's build repository's build script, in the place of eugr's build-and-copy.sh: run as root on
# a bed head, it makes the lane image from nothing but the rootfs the bed gives every node. The
# rootfs is imported as the base (as the bed's image_build makes sparkbed/stage:1), then lane/ (the
# bed's lane image recipe, images/sparkbed-lane, copied here by the bed) is built on top of it.
#
#   ./build.sh [--tag TAG] [--rootfs DIR]    (defaults sparkbed/build-lane:latest, /var/lib/sparkbed/image-rootfs)
set -euo pipefail
tag=sparkbed/build-lane:latest
rootfs=/var/lib/sparkbed/image-rootfs
while [ "$#" -gt 0 ]; do
    case $1 in
    --tag)
        tag=$2
        shift 2
        ;;
    --rootfs)
        rootfs=$2
        shift 2
        ;;
    *)
        echo "build.sh: unknown option $1 (usage: ./build.sh [--tag TAG] [--rootfs DIR])" >&2
        exit 2
        ;;
    esac
done
cd "$(dirname "$0")"
[ -d "$rootfs" ] || { echo "build.sh: no $rootfs: run it on a bed node" >&2; exit 1; }
base=sparkbed/build-base:$$
echo "build.sh: importing $rootfs"
tar -C "$rootfs" -c . | docker import -c 'ENV PYTHONPATH=/opt/hf' - "$base" > /dev/null
trap 'docker image rm "$base" > /dev/null 2>&1 || true' EXIT
echo "build.sh: building $tag on it"
docker build --tag "$tag" --build-arg "BASE_IMAGE=$base" --file lane/Dockerfile lane
echo "build.sh: built $tag"
