"""
``python -m sparkbed build|up|down|reboot|status|exec|run`` -- the simulated cluster.

Run as root. ``up`` clears whatever an earlier (killed) run left, then starts N nodes.
"""

import argparse
import os
import sys

import sparkbed as bed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="bring up N simulated nodes")
    p_up.add_argument("--nodes", type=int, default=2)
    p_up.add_argument("--shape", choices=sorted(bed.SHAPES), default=bed.DEFAULT_SHAPE,
                      help="the nodes' netdevs and RDMA devices, the cabled port, users (sparkbed.layout.SHAPES)")
    p_build = sub.add_parser("build", help="build what the bed caches (base, image rootfs, tiny model), once")
    p_build.add_argument("--without-model", action="store_true",
                         help="the base and the image rootfs only: what needs no vLLM (runs beside pip)")
    sub.add_parser("down", help="stop every node and remove all bed state")
    p_reboot = sub.add_parser("reboot", help="reboot a node (systemctl reboot inside it)")
    p_reboot.add_argument("node")
    sub.add_parser("status", help="list the nodes")
    p_exec = sub.add_parser("exec", help="run a command inside a node as root")
    p_exec.add_argument("node")
    p_exec.add_argument("cmd", nargs=argparse.REMAINDER)
    p_run = sub.add_parser("run", help="run a command in the management namespace (the controller's)")
    p_run.add_argument("cmd", nargs=argparse.REMAINDER)
    p_sup = sub.add_parser("supervise", help=argparse.SUPPRESS)
    p_sup.add_argument("node")
    args = parser.parse_args(argv)

    if os.geteuid() != 0:
        parser.error("the bed needs root (namespaces, mounts, nspawn)")
    if args.command == "build":
        bed.build(model=not args.without_model)
    elif args.command == "up":
        bed.up(args.nodes, args.shape)
    elif args.command == "down":
        bed.down()
    elif args.command == "reboot":
        bed.reboot(args.node)
    elif args.command == "status":
        for node in bed.read_state().get("nodes", []):
            pid = bed.container_pid(node["name"])
            print(f"{node['name']}\t{node['user']}@{node['mgmt_ip']}\tfabric {node['fabric_ip']}\t"
                  f"{'running pid ' + str(pid) if pid else 'stopped'}")
    elif args.command == "exec":
        return bed.node_exec(args.node, *args.cmd, check=False, capture=False).returncode
    elif args.command == "run":
        return bed.in_netns(bed.MGMT_NS, *args.cmd, check=False, env=bed.controller_env()).returncode
    elif args.command == "supervise":
        return bed.supervise(args.node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
