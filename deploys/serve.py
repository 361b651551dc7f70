"""
Bare or torn-down cluster -> serving lane.

    pyinfra inventory/pair.py deploys/serve.py

preflight (nothing changes if a node is not fit), prepare (fabric, NCCL, SSH mesh), stage (one image
ID and the model snapshots on every node), lane (validated by vLLM, units on every node, ready, warm).
"""

from pyinfra import local

local.include("deploys/preflight.py")
local.include("deploys/prepare.py")
local.include("deploys/stage.py")
local.include("deploys/lane.py")
