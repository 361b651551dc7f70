"""
Facts: what a node's state is now, read from the node itself, one module per domain (as
pyinfra's ``pyinfra.facts.<domain>``); ``reading`` is how they are read.
"""
