"""sluicectl apply, delete, get and explain: the agent's objects and what they mean.

They talk to the agent over its socket (the network's agentSocket); apply and
delete return once the datapath enforces the new state.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from cni.cli.common import conf_option, load_conflist, netconf_of


def ask(conf_path: str | None, request: dict[str, Any]) -> dict[str, Any]:
    from cni.plugin.client import AgentUnavailable, RequestTooLarge, call

    conf = netconf_of(load_conflist(conf_path))
    try:
        answer = call(conf.agent_socket, {"v": 1, **request}, timeout=600)
    except AgentUnavailable as err:
        raise click.ClickException(f"{err} (is `sluicectl agent` running?)") from None
    except RequestTooLarge as err:
        what = "the manifest" if "manifest" in request else "the request"
        raise click.ClickException(
            f"{what} was not sent: {err}; apply its objects from several smaller files, "
            "or give the agent its objects through the Kubernetes API"
        ) from None
    if "error" in answer:
        raise click.ClickException(str(answer["error"]))
    return answer


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path) as f:
            return f.read()
    except OSError as err:
        raise click.ClickException(f'failed to read "{path}": {err.strerror}') from None


file_option = click.option(
    "-f",
    "--filename",
    "path",
    required=True,
    help="YAML or JSON manifest (Namespace, Pod, NetworkPolicy, Service); - for stdin.",
)


@click.command()
@conf_option
@file_option
def apply(conf_path: str | None, path: str) -> None:
    """Store the manifest's objects in the agent and enforce them."""
    answer = ask(conf_path, {"op": "apply", "manifest": _read(path)})
    for name in answer["objects"]:
        click.echo(f"{name} applied")
    click.echo(f"{answer['endpoints']} endpoint(s) updated in {answer['seconds']:.3f} s")


@click.command()
@conf_option
@file_option
def delete(conf_path: str | None, path: str) -> None:
    """Remove the manifest's objects from the agent (by kind, namespace and name)."""
    answer = ask(conf_path, {"op": "delete", "manifest": _read(path)})
    for name in answer["objects"]:
        click.echo(f"{name} deleted")
    click.echo(f"{answer['endpoints']} endpoint(s) updated in {answer['seconds']:.3f} s")


output_option = click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "wide", "json", "yaml"]),
    default="table",
    show_default=True,
)


@click.command()
@conf_option
@click.argument("what", type=click.Choice(["endpoints", "policies"]))
@output_option
def get(conf_path: str | None, what: str, output: str) -> None:
    """List the agent's endpoints or policies."""
    items = ask(conf_path, {"op": "get", "what": what})[what]
    if output in ("json", "yaml"):
        click.echo(_dump({what: items}, output))
        return
    if what == "endpoints":
        columns = ["pod", "ips", "ingress", "egress", "policies"]
        if output == "wide":
            columns += ["container", "ifname", "ifindex", "generation"]
        rows = [
            {
                "pod": e["pod"] or "-",
                "ips": ",".join(e["ips"]),
                "ingress": "isolated" if e["ingressIsolated"] else "open",
                "egress": "isolated" if e["egressIsolated"] else "open",
                "policies": ",".join(e["policies"]) or "-",
                "container": e["containerID"][:16],
                "ifname": e["ifname"],
                "ifindex": str(e["ifindex"]),
                "generation": str(e["generation"]) + (" (pending)" if e["pending"] else ""),
            }
            for e in items
        ]
    else:
        # A refused policy (the API server accepted it, sluice cannot read all of it)
        # isolates what it selects; what it could not read allows nothing.
        columns = ["policy", "types", "status", "local pods"]
        if output == "wide":
            columns += ["ingress rules", "egress rules", "refused because"]
        rows = [
            {
                "policy": p["policy"],
                "types": ",".join(p["policyTypes"]),
                "status": "refused" if p.get("refused") else "enforced",
                "local pods": ",".join(p["localPods"]) or "-",
                "ingress rules": str(p["ingressRules"]),
                "egress rules": str(p["egressRules"]),
                "refused because": "; ".join(p.get("refused") or ()) or "-",
            }
            for p in items
        ]
    click.echo(_table(columns, rows))


@click.command()
@conf_option
@click.argument("pod", metavar="NAMESPACE/POD")
@click.option(
    "--to", "to", default=None, metavar="ADDR:PORT/PROTO", help="The verdict for this egress flow."
)
@click.option(
    "--from",
    "from_",
    default=None,
    metavar="ADDR:PORT/PROTO",
    help="The verdict for this ingress flow (PORT is the pod's).",
)
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text")
def explain(
    conf_path: str | None, pod: str, to: str | None, from_: str | None, output: str
) -> None:
    """Which policies select the pod and what it may send and receive; with --to or
    --from, the verdict for one flow and the rule that decides it."""
    if to and from_:
        raise click.UsageError("give --to or --from, not both")
    flow = None
    if to or from_:
        flow = {"direction": "egress" if to else "ingress", **_flow(to or from_)}
    answer = ask(conf_path, {"op": "explain", "pod": pod, "flow": flow})
    if output != "text":
        click.echo(_dump(answer.get("verdict") or answer.get("explanation"), output))
    elif flow is None:
        click.echo(answer["text"])
    else:
        verdict = answer["verdict"]
        word = "ALLOW" if verdict["allowed"] else "DENY"
        where = f"{flow['address']}:{flow['port']}/{flow['protocol'].lower()}"
        arrow = "->" if flow["direction"] == "egress" else "<-"
        click.echo(f"{word} {pod} {arrow} {where}: {verdict['reason']}")
        if verdict["policy"]:
            click.echo(
                f"  decided by {verdict['policy']} {flow['direction']} rule {verdict['rule']}"
            )


def _flow(text: str | None) -> dict[str, Any]:
    assert text is not None
    address, _, rest = text.rpartition(":")
    port, _, protocol = rest.partition("/")
    try:
        return {"address": address, "port": int(port), "protocol": (protocol or "tcp").upper()}
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected ADDR:PORT/PROTO") from None


def _dump(data: Any, output: str) -> str:
    if output == "yaml":
        import yaml

        return yaml.safe_dump(data, sort_keys=False).rstrip()
    return json.dumps(data, indent=2)


def _table(columns: list[str], rows: list[dict[str, str]]) -> str:
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)
