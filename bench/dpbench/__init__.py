"""The datapath benchmark's parts: pods and their wiring (topology), traffic run in
the pods (traffic), the policies (configs), the iptables baseline (iptables),
the table (report), and cleanup plumbing (plumbing)."""
