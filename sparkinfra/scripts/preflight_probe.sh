#!/bin/sh
# preflight.PreflightProbe: key=value lines about a node, read in one round trip.
#   preflight_probe.sh MODEL_DIR INTERFACE PROGRAMS KNOWN_GOOD HISTORY [PORT...]
#   gpu=NAME (gpu=!missing without nvidia-smi), docker=VERSION of the daemon that answered
#   (docker=!missing without docker, docker=!ERROR: the first line of docker's error when the
#   daemon does not answer), free=BYTES under MODEL_DIR (or its nearest existing parent),
#   used=BYTES staged there, link=the `ip -o link` line of INTERFACE,
#   rdma=the device nodes in /dev/infiniband (what a lane's container is given), one
#   hca=DEVICE NETDEV <FLAGS> line per RDMA device (its PCI function's netdev, as ibdev2netdev
#   reads it, and that netdev's link flags: a GB10's port is two twins), one
#   gen=NETDEV MODE line for INTERFACE and each HCA's netdev (its IPv6 addr_gen_mode: 0 is eui64,
#   - when it has none), one width=DEVICE CURRENT MAX line per RDMA device (the lanes its PCIe
#   link trained at, of those it has), kernel=the running kernel's release, cma=the kernel's CMA
#   area in kB (/proc/meminfo's CmaTotal; empty when the kernel has none), and one
#   port=PORT pid= comm= container= line per listener on each PORT; where the node programs
#   (PROGRAMS) are placed, platform=the JSON of their platform_facts over KNOWN_GOOD (what changed
#   beneath the lanes since the newest known good set), and starts=the seconds each of the lane's
#   last starts took to get ready, from its restart history HISTORY (the head's; - for none).
#   One addr=NETDEV CIDR line per IPv4 address of the node (what the fabric subnet must not overlap).
dir=$1 iface=$2 programs=$3 known=$4 history=$5
shift 5
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -n 1)"
else
  echo 'gpu=!missing'
fi
if ! command -v docker >/dev/null 2>&1; then
  echo 'docker=!missing'
else
  version=$(timeout 30 docker version --format '{{.Server.Version}}' 2>/dev/null)
  rc=$?
  if [ "$rc" = 0 ] && [ -n "$version" ]; then
    echo "docker=$version"
  elif [ "$rc" = 124 ]; then
    echo 'docker=!docker version timed out after 30 s'
  else
    error=$(timeout 30 docker version --format '{{.Server.Version}}' 2>&1 >/dev/null | tr -d '\r' | grep -m 1 .)
    echo "docker=!${error:-docker version exited $rc}"
  fi
fi
p=$dir
while [ ! -e "$p" ]; do p=$(dirname -- "$p"); done
echo "free=$(df -PB1 -- "$p" | awk 'NR==2 {print $4}')"
echo "used=$(du -sb -- "$dir" 2>/dev/null | cut -f1)"
echo "link=$(ip -o link show dev "$iface" 2>/dev/null | head -n 1)"
devices=
for d in /dev/infiniband/*; do [ -e "$d" ] && devices="$devices ${d##*/}"; done
echo "rdma=${devices# }"
gen() { echo "gen=$1 $(cat "/proc/sys/net/ipv6/conf/$1/addr_gen_mode" 2>/dev/null || echo -)"; }
gen "$iface"
for d in /sys/class/infiniband/*; do
  [ -d "$d" ] || continue
  n=
  for x in "$d"/device/net/*; do [ -e "$x" ] && n=${x##*/} && break; done
  echo "hca=${d##*/} ${n:--} $(ip -o link show dev "${n:-none}" 2>/dev/null | grep -o '<[^>]*>' | head -n 1)"
  [ -n "$n" ] && [ "$n" != "$iface" ] && gen "$n"
  echo "width=${d##*/} $(cat "$d/device/current_link_width" 2>/dev/null || echo -) $(cat "$d/device/max_link_width" 2>/dev/null || echo -)"
done
ip -o -4 addr show 2>/dev/null | awk '{print "addr=" $2 " " $4}'
echo "kernel=$(uname -r)"
echo "cma=$(awk '$1 == "CmaTotal:" {print $2}' /proc/meminfo)"
if [ "$history" != - ] && [ -r "$history" ]; then
  echo "starts=$(tail -n 200 "$history" | grep '"event": "ready"' | grep -o '"seconds": [0-9.]*' | tail -n 10 | cut -d' ' -f2 | tr '\n' ' ')"
fi
if [ -f "$programs/platform_facts.py" ]; then
  echo "platform=$(python3 "$programs" platform_facts "$known" 2>/dev/null)"
fi
for port in "$@"; do
  ss -Hltnp "( sport = :$port )" | while read -r l; do
    pid=$(echo "$l" | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2)
    comm=$(echo "$l" | grep -o 'users:(("[^"]*' | cut -d'"' -f2)
    cid=$(grep -o 'docker[-/][0-9a-f]\{12,\}' "/proc/$pid/cgroup" 2>/dev/null | head -n 1 | grep -o '[0-9a-f]\{12,\}')
    name=
    [ -n "$cid" ] && name=$(docker inspect -f '{{.Name}}' "$cid" 2>/dev/null)
    echo "port=$port pid=$pid comm=$comm container=${name#/}"
  done
done
true
