"""sluice address management: node-CIDR allocation over a crash-safe store."""
