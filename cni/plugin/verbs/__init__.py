"""The CNI verbs as typed functions: ``add``, ``delete``, ``check``, ``status`` and
``gc`` in their own modules, each with a ``run(request)`` that parses a runtime
call into typed values first. The plugin, the agent and sluicectl call them.
"""

from __future__ import annotations

from cni.plugin import netconf
from cni.plugin.netconf import NetConf
from cni.spec import log
from cni.spec.errors import ERR_TRY_AGAIN, CNIError
from cni.spec.protocol import Request


def agent_required(conf: NetConf) -> str:
    return (
        f'"policy": "enforce" needs the sluice agent to compute and install the pod\'s '
        f'policy, and none answers on "{conf.agent_socket}" (start `sluicectl agent`, '
        'or set "policy": "off" to run without enforcement)'
    )


def load_conf(request: Request) -> NetConf:
    conf = netconf.from_request(request)
    log.setup(conf.log_file)
    return conf


def refuse_without_agent(conf: NetConf) -> None:
    """Run in the plugin's own process (no agent answered): ADD and CHECK refuse a pod
    whose policy nobody would enforce; the runtime tries again later."""
    if conf.policy == "enforce":
        raise CNIError(ERR_TRY_AGAIN, agent_required(conf))
