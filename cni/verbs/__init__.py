"""The CNI verbs as typed functions: ``add``, ``delete``, ``check``, ``status`` and
``gc`` in their own modules, each with a ``run(request)`` that parses a runtime
call into typed values first. The plugin, the agent and sluicectl call them.
"""

from __future__ import annotations

from cni import log, netconf
from cni.errors import ERR_INVALID_CONFIG, CNIError
from cni.netconf import NetConf
from cni.protocol import Request

AGENT_REQUIRED = (
    '"policy": "enforce" needs the sluice node agent to compute and install '
    'NetworkPolicy, and this sluice has no agent yet; set "policy": "off" to run '
    "without enforcement"
)


def load_conf(request: Request) -> NetConf:
    conf = netconf.from_request(request)
    log.setup(conf.log_file)
    return conf


def require_standalone(conf: NetConf) -> None:
    """ADD and CHECK refuse to wire a pod whose policy nobody would enforce."""
    if conf.policy == "enforce":
        raise CNIError(ERR_INVALID_CONFIG, AGENT_REQUIRED)
