"""
Operations: each ensures one piece of node state and yields commands only when the fact says the
state differs, one module per domain (as pyinfra's ``pyinfra.operations.<domain>``).
"""
