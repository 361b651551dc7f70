"""
Every node checked before any change: SSH (a changed host key named, with how to accept it), the
GB10, dockerd answering, free disk for the models, the head's ports, the fabric link, the RDMA
devices. Also the first step of ``deploys/serve.py``.

    pyinfra inventory/pair.py deploys/preflight.py
"""

from sparkinfra import run

run.start(preflight_first=True)  # every node checked once, before any operation
