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
#
# The build's output goes to FOLDER/build.log (kept: the whole of it is there after a build); every
# PROGRESS_EVERY seconds (default 5) a line names the step it is at when that changed, or every
# 6 such periods all the same, then one line with its time; on failure, the log's last 40 lines.
# A repository's fetch says git's progress the same way:
#   build TAG: 40 s, Receiving objects:  45% (81920/182044), 112.00 MiB | 9.10 MiB/s
#   build TAG: 125 s, [stage-1 3/7] RUN pip install vllm
#   build TAG: built in 930 s
set -eu
tag=$1 folder=$2 tarball=$3 kind=$4
shift 4
fail() { echo "image_build $tag: $*" >&2; exit 1; }
every=${PROGRESS_EVERY:-5}
log=$folder/build.log
t0=$(date +%s)
tail_lines=40

# logged COMMAND...: run it with its output in $log and the progress lines on stdout; its status,
# after the log's last $tail_lines lines (40 unless set) on stderr if it failed. A step is docker's:
# BuildKit's "#N [stage i/n] INSTRUCTION", the legacy builder's "Step i/n : ...", or git's
# "Receiving objects: 45% ..." (its progress comes as \r-separated updates).
logged() {
    : > "$log"
    (
        nap='' last='' quiet=0
        trap 'kill $nap 2> /dev/null; exit 0' TERM
        while sleep "$every" & nap=$!; wait $nap; do
            step=$(tr '\r' '\n' < "$log" |
                grep -E '^#[0-9]+ \[|^Step [0-9]+/[0-9]+ : |^(remote: )?(Counting|Compressing|Receiving|Resolving) ' |
                tail -n 1 | sed 's/^#[0-9]* //; s/, done\.$//' | cut -c 1-120)
            quiet=$((quiet + 1))
            if [ "$step" != "$last" ] || [ $quiet -ge 6 ]; then
                echo "build $tag: $(($(date +%s) - t0)) s${step:+, $step}"
                last=$step quiet=0
            fi
        done
    ) &
    progress=$!
    status=0
    BUILDKIT_PROGRESS=plain "$@" > "$log" 2>&1 || status=$?
    kill $progress 2> /dev/null || true
    wait $progress || true
    if [ $status != 0 ]; then
        tail -n "$tail_lines" "$log" >&2
    fi
    return $status
}

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
    logged docker build --tag "$tag" --file "$folder/files/$dockerfile" "$@" "$folder/files" ||
        fail "docker build failed (the last lines of its log are above, all of it is in $log)"
    ;;
repository)
    url=$1 commit=$2 produces=$3 npatches=$4
    shift 4
    command -v git > /dev/null || fail "git is not installed on this host: a repository recipe needs it"
    src=$folder/src
    [ -d "$src/.git" ] || git init -q "$src" || fail "cannot create $src"
    cd "$src"
    if ! git cat-file -e "$commit^{commit}" 2> /dev/null; then
        # By id first; a server that does not serve a commit by id (git's dumb HTTP, an old
        # server without uploadpack.allowReachableSHA1InWant): every branch and tag.
        tail_lines=0  # by id may fail where every branch succeeds: quiet
        logged git fetch --progress --depth 1 "$url" "$commit" || {
            tail_lines=40
            logged git fetch --progress "$url" '+refs/heads/*:refs/remotes/build/*' '+refs/tags/*:refs/tags/*'
        } || fail "cannot fetch from $url (the last lines of git's output are above)"
        tail_lines=40
        git cat-file -e "$commit^{commit}" 2> /dev/null ||
            fail "$url has no commit $commit (force-pushed away? move the lock: python -m sparkinfra lock)"
    fi
    git checkout -q --force --detach "$commit" || fail "cannot check out $commit"
    git clean -q -f -d -x
    while [ "$npatches" -gt 0 ]; do
        patch=$1
        shift
        npatches=$((npatches - 1))
        git apply "$folder/files/$patch" || fail "patch $patch does not apply to $commit"
    done
    logged "$@" || fail "the build script $* failed (the last lines of its log are above, all of it is in $log)"
    docker image inspect "$produces" > /dev/null 2>&1 || fail "the build script made no image $produces"
    docker tag "$produces" "$tag"
    ;;
*)
    fail "unknown recipe kind $kind"
    ;;
esac
echo "build $tag: built in $(($(date +%s) - t0)) s"
