# Defaults for every cluster. Each key is a field of sparkinfra.settings.HostSettings
# (see docs/settings.md); anything else is refused before any host is touched.

_sudo = True  # pyinfra: run operations through sudo (node users need not be root)
