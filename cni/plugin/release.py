"""sluice's release: the one version of the package, the launchers, the agent and
the image.

``pyproject.toml`` reads it from here (``[tool.setuptools.dynamic]``), so
``sluicectl --version``, the image's tag and label, the DaemonSet's image tag and
the ``sluiceVersion`` of the plugin's VERSION answer all say the same. A plain
constant, not ``importlib.metadata``: the ``sluice`` executable sends it with every
forwarded call, and reading the distribution's metadata costs more than the call.
"""

VERSION = "0.1.0"

# The environment entry a forwarded CNI call carries: the release of the launcher
# (and of the plugin code it runs) that sent it.
CALLER_KEY = "SLUICE_RELEASE"


def caller_mismatch(caller: str | None) -> str | None:
    """Why the agent refuses a call sent by a launcher of release ``caller`` (None: the
    frame named none, a launcher older than the check), or None when it is this one."""
    if caller == VERSION:
        return None
    named = f"release {caller}" if caller else "a release that does not name itself"
    return (
        f"the sluice launcher on this node is of {named}, the agent of release {VERSION}: "
        f"run `sluicectl install` of release {VERSION} (the DaemonSet's init container "
        "does) so that the launcher and the agent agree"
    )
