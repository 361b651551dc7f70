"""
pyinfra's config file for this project: pyinfra executes it before it loads the inventory.

Every run from the project root checks the settings of the inventory it names (whichever it is:
a file with or without a last line of its own, a host list, a generated one) before pyinfra
connects to anything; bad ones are refused with the file (or ``--data``), the key and the host.
"""

from sparkinfra.run import check_command_line

check_command_line()
