"""
Bare or torn-down cluster -> serving lane.

    pyinfra inventory/pair.py deploys/serve.py

Steps so far: prepare (fabric). Staging and the lane units join as they land.
"""

from pyinfra import local

local.include("deploys/prepare.py")
