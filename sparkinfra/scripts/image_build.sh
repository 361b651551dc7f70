#!/bin/sh
# Run as root on the head: build an image recipe (sparkinfra.lanes.images) and tag it TAG.
#
#   image_build.sh TAG FOLDER TARBALL dockerfile DOCKERFILE [NAME=VALUE...]
#   image_build.sh TAG FOLDER TARBALL repository URL COMMIT PRODUCES NPATCHES [PATCH...] SCRIPT [ARG...]
#
# TARBALL holds the recipe's files; they replace FOLDER/files (the build context, or the patches).
# A repository is checked out in FOLDER/src at COMMIT, kept between builds (as docker keeps its
# build cache), reset and cleaned, patched in order, then built by its own SCRIPT, which makes the
# image PRODUCES. Each failure names its step.
set -eu
tag=$1 folder=$2 tarball=$3 kind=$4
shift 4
fail() { echo "image_build $tag: $*" >&2; exit 1; }

rm -rf "$folder/files"
mkdir -p "$folder/files"
tar -x -f "$tarball" -C "$folder/files" || fail "cannot unpack the recipe's files"
rm -f "$tarball"

case $kind in
dockerfile)
    dockerfile=$1
    shift
    n=$#
    for arg in "$@"; do
        set -- "$@" --build-arg "$arg"
    done
    shift "$n"
    docker build --tag "$tag" --file "$folder/files/$dockerfile" "$@" "$folder/files" ||
        fail "docker build failed (the lines above say why)"
    ;;
repository)
    url=$1 commit=$2 produces=$3 npatches=$4
    shift 4
    command -v git > /dev/null || fail "git is not installed on this host: a repository recipe needs it"
    src=$folder/src
    [ -d "$src/.git" ] || git init -q "$src" || fail "cannot create $src"
    cd "$src"
    if ! git cat-file -e "$commit^{commit}" 2> /dev/null; then
        git fetch -q --depth 1 "$url" "$commit" || fail "cannot fetch $commit from $url"
    fi
    git checkout -q --force --detach "$commit" || fail "cannot check out $commit"
    git clean -q -f -d -x
    while [ "$npatches" -gt 0 ]; do
        patch=$1
        shift
        npatches=$((npatches - 1))
        git apply "$folder/files/$patch" || fail "patch $patch does not apply to $commit"
    done
    "$@" || fail "the build script $* failed (the lines above say why)"
    docker image inspect "$produces" > /dev/null 2>&1 || fail "the build script made no image $produces"
    docker tag "$produces" "$tag"
    ;;
*)
    fail "unknown recipe kind $kind"
    ;;
esac
