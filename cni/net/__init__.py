"""Kernel helpers: network namespaces, netlink (links, addresses, routes,
neighbours), sysctls and nftables masquerading. They take plain values
(names, indexes, addresses as strings) and know nothing of CNI requests.
"""
