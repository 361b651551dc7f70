#!/bin/sh
# facts.firewall.FirewallTable: the kernel's ephemeral port range, then the live table inet
# sparkinfra as nftables' JSON (nothing when there is none), or no-nft when nft is missing.
#   firewall_table.sh
echo "ephemeral $(cat /proc/sys/net/ipv4/ip_local_port_range)"
if ! command -v nft >/dev/null 2>&1; then echo no-nft; exit 0; fi
nft -j list table inet sparkinfra 2>/dev/null || true
