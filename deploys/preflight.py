"""
Every node checked before any change: SSH, the GB10, free disk for the models, the head's ports,
the fabric link. Also the first step of ``deploys/serve.py``.

    pyinfra inventory/pair.py deploys/preflight.py
"""

from pyinfra import state

from sparkinfra import preflight, settings

preflight.run(state, settings.current())
