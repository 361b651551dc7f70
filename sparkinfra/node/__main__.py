"""
``python3 PROGRAMS PROGRAM ARGS...``: run the node program ``PROGRAM`` (a module of this package)
with ``ARGS``, as ``python3 -m`` would, whatever the folder is called where it was placed.
"""

import os
import runpy
import sys

sys.dont_write_bytecode = True  # the folder holds what the controller placed, nothing else
here = os.path.dirname(os.path.abspath(__file__))
if len(sys.argv) < 2 or not os.path.isfile(os.path.join(here, sys.argv[1] + ".py")):
    print(f"usage: python3 {here} PROGRAM ARGS...; programs: "
          + ", ".join(sorted(n[:-3] for n in os.listdir(here) if n.endswith(".py") and not n.startswith("_"))),
          file=sys.stderr)
    sys.exit(2)
sys.path[0] = os.path.dirname(here)  # the package's parent, so its modules import each other
sys.argv = [os.path.join(here, sys.argv[1] + ".py"), *sys.argv[2:]]
runpy.run_module(f"{os.path.basename(here)}.{sys.argv[0][len(here) + 1:-3]}", run_name="__main__", alter_sys=True)
