"""A sandbox's egress policy: read it, replace it (PUT) or change some of its fields (PATCH)."""

from __future__ import annotations

from fastapi import APIRouter

from pandastack.wire.sandboxes import NetworkSpec

from ..accounts.auth import CurrentPrincipal
from ..web.jsonbody import StrictJsonRoute
from .deps import SandboxId, Service

router = APIRouter(tags=["network"], route_class=StrictJsonRoute)

POLICY_NOTES = ("Entries are CIDRs or domain names (`example.com`, `*.example.com` for the "
                "names below it, `.example.com` for both), judged by the host's egress proxy "
                "on TCP 80/443 by the TLS SNI or HTTP Host the guest sends, never by the "
                "guest's DNS answers. `allow_out` wins over `deny_out` and over "
                "`internet: false`, but never opens the always-denied ranges (private, "
                "loopback, link-local/cloud metadata, CGNAT, multicast and reserved, the "
                "host, other sandboxes): an `allow_out` CIDR reaching into them (e.g. "
                "`0.0.0.0/0`, `10.0.0.0/8`, `169.254.169.254/32`) is refused with 422 naming "
                "it, unless that part lies in the ranges the server's operator lets tenants "
                "open (`PANDASTACK_NETWORK_OPERATOR_ALLOW`); a name whose addresses lie "
                "there reaches nothing. Takes effect for new connections at once; a "
                "hibernated sandbox stays hibernated.")


@router.get("/sandboxes/{sandbox_id}/network",
            operation_id="getNetworkPolicy", response_model=NetworkSpec,
            summary="The sandbox's egress policy")
async def get_network(sandbox_id: SandboxId, who: CurrentPrincipal,
                      service: Service) -> NetworkSpec:
    return await service.network(who.team, sandbox_id)


@router.put("/sandboxes/{sandbox_id}/network",
            operation_id="setNetworkPolicy", response_model=NetworkSpec,
            summary="Replace the egress policy (fields left out take their defaults)",
            description=POLICY_NOTES)
async def put_network(sandbox_id: SandboxId, body: NetworkSpec, who: CurrentPrincipal,
                      service: Service) -> NetworkSpec:
    return await service.update_network(who.team, sandbox_id, body, merge=False)


@router.patch("/sandboxes/{sandbox_id}/network",
              operation_id="updateNetworkPolicy", response_model=NetworkSpec,
              summary="Change the fields of the egress policy that the body sets",
              description=POLICY_NOTES)
async def patch_network(sandbox_id: SandboxId, body: NetworkSpec, who: CurrentPrincipal,
                        service: Service) -> NetworkSpec:
    return await service.update_network(who.team, sandbox_id, body, merge=True)
