"""The node agent (``sluicectl agent``): one long-lived process per node that
keeps the datapath, netlink and the IPAM store open, serves the plugin's CNI
calls over a unix socket, and computes and installs every pod's policy.

``cni.plugin.frames`` and ``cni.plugin.client`` use only the standard library:
the ``sluice`` executable imports them on every call.
"""
