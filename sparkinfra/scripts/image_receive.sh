#!/bin/sh
# Run as root on a worker, in the head's SSH session (image_fanout.py; the stream on stdin): say
# the layers of every image here (one JSON list of diff IDs per image, then "ready"), load what the
# head sends (only the layers this worker lacks: docker opens a layer's file only when it lacks
# that layer), then say IMAGE's ID.
#
#   image_receive.sh IMAGE
set -u
image=$1
ids=$(docker image ls -aq --no-trunc 2> /dev/null | sort -u)
if [ -n "$ids" ]; then
    # shellcheck disable=SC2086  # one word per ID
    docker image inspect --format '{{json .RootFS.Layers}}' $ids 2> /dev/null
fi
echo ready
docker load -q > /dev/null || exit 1
docker image inspect --format '{{.Id}}' "$image"
