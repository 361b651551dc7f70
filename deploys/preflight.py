"""
Every node checked before any change: SSH, the GB10, free disk for the models, the head's ports,
the fabric link. Also the first step of ``deploys/serve.py``.

    pyinfra inventory/pair.py deploys/preflight.py
"""

from pyinfra import inventory, state

from sparkinfra import lock, preflight, settings, ssh

ssh.prompt_replies(state)  # no delayed-ACK wait on each command
lock.hold(state, inventory, settings.current())  # one converge at a time
preflight.run(state, settings.current())
