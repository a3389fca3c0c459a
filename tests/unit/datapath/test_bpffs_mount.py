"""Where the datapath's bpffs is: mounted, missing, or a mount of something else (a
container's hostPath of a node without bpffs there, which a mount of the agent's
own would hide from the node)."""

from __future__ import annotations

from cni.datapath.loader import mount_type

HOST = """sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
bpf /sys/fs/bpf bpf rw,nosuid,nodev,noexec,relatime,mode=700 0 0
"""
CONTAINER_WITHOUT_NODE_BPFFS = """overlay / overlay rw,relatime 0 0
sysfs /sys sysfs ro,nosuid,nodev,noexec,relatime 0 0
sysfs /sys/fs/bpf sysfs rw,nosuid,nodev,noexec,relatime 0 0
"""
STACKED = CONTAINER_WITHOUT_NODE_BPFFS + "bpf /sys/fs/bpf bpf rw,relatime 0 0\n"


def test_bpffs_at_the_path_is_found() -> None:
    assert mount_type(HOST, "/sys/fs/bpf") == "bpf"


def test_a_hostpath_of_sysfs_is_told_apart() -> None:
    assert mount_type(CONTAINER_WITHOUT_NODE_BPFFS, "/sys/fs/bpf") == "sysfs"


def test_the_topmost_mount_counts() -> None:
    assert mount_type(STACKED, "/sys/fs/bpf") == "bpf"


def test_nothing_mounted_there() -> None:
    assert mount_type("sysfs /sys sysfs rw 0 0\n", "/sys/fs/bpf") is None
    assert mount_type("", "/sys/fs/bpf") is None
