"""
Every node checked before any change: SSH, the GB10, free disk for the models, the head's ports,
the fabric link. Also the first step of ``deploys/serve.py``.

    pyinfra inventory/pair.py deploys/preflight.py
"""

from sparkinfra import run

run.start(preflight_first=True)  # every node checked once, before any operation
