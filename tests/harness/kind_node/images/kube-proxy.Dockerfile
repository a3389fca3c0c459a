# kube-proxy with the iptables, nft and conntrack it runs; iptables picks the
# backend the node uses (iptables-wrapper), like the upstream image.
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iptables nftables conntrack ipset kmod \
 && rm -rf /var/lib/apt/lists/*
COPY iptables-wrapper /usr/sbin/iptables-wrapper
RUN for tool in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do \
      ln -sf iptables-wrapper "/usr/sbin/$tool"; \
    done
COPY bin/kube-proxy /usr/local/bin/kube-proxy
